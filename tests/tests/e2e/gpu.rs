//! The GPU collector on a host without an NVIDIA driver: `serve --gpu` says so once and serves
//! without it; `gpu-agent` exits non-zero naming the problem.

use std::process::Command;

use weft_tests::{Weft, weft_binary};

#[test]
fn without_a_driver_serve_runs_on_and_the_agent_refuses() {
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        return; // a GPU host: benches/gpu-check.sh covers the real collector
    }
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &["--gpu", "--gpu-interval", "1s"]);
    let reply = reqwest_free_get(&format!("{}/ready", w.http));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    drop(w);
    let out = Command::new(weft_binary())
        .args([
            "gpu-agent",
            "--target",
            "http://127.0.0.1:9",
            "--samples",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no NVIDIA driver or NVML library"),
        "{stderr}"
    );
}

/// A bare HTTP GET (status line and all).
fn reqwest_free_get(url: &str) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let (host, path) = addr.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
