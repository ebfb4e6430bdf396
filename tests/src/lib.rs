//! End-to-end test support: start the real `weft` binary on free ports in a temporary data
//! directory, and stop it gently (SIGTERM) or not (SIGKILL).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `weft` binary under test: `$WEFT_BIN`, or the one next to the test executable.
pub fn weft_binary() -> PathBuf {
    if let Ok(p) = std::env::var("WEFT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("weft");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p weft-api` first or set WEFT_BIN",
        bin.display()
    );
    bin
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `weft serve`.
pub struct Weft {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub grpc: String,
    pub otlp: String,
    pub http: String,
    /// PostgreSQL wire port.
    pub pg: u16,
    extra: Vec<String>,
    /// Environment variables the server is started with.
    pub env: Vec<(String, String)>,
}

impl Weft {
    /// [`Weft::start`] with environment variables (an `LD_PRELOAD`, …).
    pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut w = Weft {
            child: None,
            dir: dir.to_owned(),
            grpc: String::new(),
            otlp: String::new(),
            http: String::new(),
            pg: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        w.spawn();
        w
    }

    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_with_env(dir, extra, &[])
    }

    fn spawn(&mut self) {
        // a port found free can be taken by another test's server before this one binds it:
        // the server then exits at once, and starts again on other ports
        for _ in 0..5 {
            if self.spawn_once() {
                return;
            }
        }
        panic!("weft did not become ready");
    }

    fn spawn_once(&mut self) -> bool {
        let (g, o, h, p) = (free_port(), free_port(), free_port(), free_port());
        self.pg = p;
        let scheme = if self.tls() { "https" } else { "http" };
        self.grpc = format!("{scheme}://127.0.0.1:{g}");
        self.otlp = format!("{scheme}://127.0.0.1:{o}");
        self.http = format!("{scheme}://127.0.0.1:{h}");
        let child = Command::new(weft_binary())
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.dir)
            .args([
                "--otlp-grpc-listen",
                &format!("127.0.0.1:{g}"),
                "--otlp-http-listen",
                &format!("127.0.0.1:{o}"),
                "--http-listen",
                &format!("127.0.0.1:{h}"),
                "--pg-listen",
                &format!("127.0.0.1:{p}"),
            ])
            .args(&self.extra)
            .env("WEFT_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .spawn()
            .expect("start weft");
        self.child = Some(child);
        self.wait_ready()
    }

    /// Whether the server was started with `--tls-cert` (its URLs are then `https://`).
    pub fn tls(&self) -> bool {
        self.extra.iter().any(|a| a == "--tls-cert")
    }

    /// Whether the server became ready; `false` when it exited first.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = self.http.split("://").nth(1).unwrap_or_default().to_owned();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().ok().flatten().is_some()
            {
                self.child = None;
                return false;
            }
            // over TLS (which may ask for a client certificate), the listener taking connections
            // is the sign: the server binds its ports only once the store is open
            if self.tls() && std::net::TcpStream::connect(&addr).is_ok() {
                return true;
            }
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                let _ = s.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                // another test's server may hold this port (found free, taken since): ready
                // only when this server's OTLP/HTTP port takes connections too
                let otlp = self.otlp.split("://").nth(1).unwrap_or_default();
                if buf.starts_with("HTTP/1.1 200") && std::net::TcpStream::connect(otlp).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("weft did not become ready");
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, no chance to flush.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .unwrap();
        c.wait().unwrap().success()
    }

    /// Starts again on the same data directory (new ports).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop it first");
        self.spawn();
    }
}

impl Drop for Weft {
    fn drop(&mut self) {
        self.kill9();
    }
}
