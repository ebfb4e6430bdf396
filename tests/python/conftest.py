"""Starts the real `weft` binary on free ports with a temporary data directory."""

import os
import pathlib
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def weft_binary() -> str:
    explicit = os.environ.get("WEFT_BIN")
    if explicit:
        return explicit
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "debug" / "weft")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Weft:
    def __init__(self, data_dir: pathlib.Path, extra: tuple = ()):
        self.grpc_port, self.otlp_port, self.http_port = free_port(), free_port(), free_port()
        self.pg_port = free_port()
        tls = "--tls-cert" in extra
        scheme = "https" if tls else "http"
        self.http = f"{scheme}://127.0.0.1:{self.http_port}"
        self.otlp_http = f"{scheme}://127.0.0.1:{self.otlp_port}"
        self.otlp_grpc = f"127.0.0.1:{self.grpc_port}"
        self.proc = subprocess.Popen(
            [
                weft_binary(), "serve",
                "--data-dir", str(data_dir),
                "--otlp-grpc-listen", self.otlp_grpc,
                "--otlp-http-listen", f"127.0.0.1:{self.otlp_port}",
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--pg-listen", f"127.0.0.1:{self.pg_port}",
                *extra,
            ],
            env={**os.environ, "WEFT_LOG": "warn"},
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if tls:
                # over TLS the listener taking connections is the sign: the ports are bound
                # only once the store is open
                try:
                    socket.create_connection(("127.0.0.1", self.http_port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(0.05)
                    continue
            try:
                with urllib.request.urlopen(f"{self.http}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("weft did not become ready")

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture
def weft(tmp_path):
    server = Weft(tmp_path / "data")
    yield server
    server.stop()
