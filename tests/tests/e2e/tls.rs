//! TLS on every port of the real binary (`--tls-cert`, `--tls-key`, `--tls-client-ca`), driven by
//! real clients: curl for OTLP/HTTP and the query API, `psql` in `sslmode=verify-full` for the
//! PostgreSQL wire, `openssl s_client` for certificate rotation on SIGHUP, with a CA the test
//! makes (`tests/pki/make.sh`). The OpenTelemetry SDK over HTTPS and gRPC with TLS is in
//! `tests/python/test_tls.py`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use weft_tests::{Weft, weft_binary};

/// A fresh CA, server and client certificates.
fn pki(dir: &Path) -> PathBuf {
    let pki = dir.join("pki");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pki/make.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(&pki)
        .output()
        .expect("bash");
    assert!(out.status.success(), "make.sh: {out:?}");
    pki
}

fn arg(p: &Path, file: &str) -> String {
    p.join(file).display().to_string()
}

fn port(url: &str) -> &str {
    url.rsplit(':').next().unwrap()
}

/// curl against `https://localhost:PORT{path}` with the given extra arguments; (exit code,
/// body).
fn curl(port: &str, path: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .expect("curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn psql(pg: u16, conn: &str, command: &str) -> Output {
    Command::new("psql")
        .arg(format!(
            "host=localhost port={pg} dbname=weft user=grafana connect_timeout=10 {conn}"
        ))
        .args(["-X", "-A", "-t", "-c", command])
        .env("PGPASSWORD", "x")
        .output()
        .expect("psql (installed by scripts/setup.sh)")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

const SPAN_JSON: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"tls-svc"}}]},"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"GET /secure","kind":2,"startTimeUnixNano":"1764460800000000000","endTimeUnixNano":"1764460800250000000"}]}]}]}"#;

/// Sends `SPAN_JSON` over OTLP/HTTPS with curl's TLS arguments `tls`; it must be accepted.
fn send_span(w: &Weft, tls: &[&str]) {
    let mut post = tls.to_vec();
    post.extend([
        "-H",
        "content-type: application/json",
        "--data-binary",
        SPAN_JSON,
    ]);
    let (rc, body) = curl(port(&w.otlp), "/v1/traces", &post);
    assert!(rc == 0 && body.ends_with("200"), "{rc} {body}");
}

#[test]
fn every_port_serves_tls_to_curl_and_psql_and_rotates_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    // the certificate files are copied: the test replaces them to rotate
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(pki.join("server.pem"), &cert).unwrap();
    std::fs::copy(pki.join("server.key"), &key).unwrap();
    let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
    let w = Weft::start(
        &dir.path().join("data"),
        &["--tls-cert", &cert_arg, "--tls-key", &key_arg],
    );
    let ca = arg(&pki, "ca.pem");
    let trust = ["--cacert", ca.as_str()];

    // the query API and OTLP/HTTP over HTTPS, verified against the test's CA
    let (rc, body) = curl(port(&w.http), "/ready", &trust);
    assert_eq!((rc, body.as_str()), (0, "ready\n\n200"));
    send_span(&w, &trust);
    let mut sql = trust.to_vec();
    sql.extend([
        "-H",
        "content-type: application/json",
        "--data-binary",
        r#"{"query": "SELECT name, service_name FROM spans"}"#,
    ]);
    let (rc, body) = curl(port(&w.http), "/api/v1/sql", &sql);
    assert!(
        rc == 0 && body.contains("GET /secure") && body.contains("tls-svc"),
        "{rc} {body}"
    );

    // what must fail: no trust in the CA, plain HTTP to a TLS port, a wrong host name
    let (rc, body) = curl(port(&w.http), "/ready", &[]);
    assert_eq!(rc, 60, "an unknown CA must fail verification: {body}");
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("http://127.0.0.1:{}/ready", port(&w.http)))
        .output()
        .unwrap();
    assert_ne!(
        String::from_utf8_lossy(&plain.stdout),
        "200",
        "plain HTTP must not be served on a TLS port"
    );

    // the failed handshakes are counted
    let (_, metrics) = curl(port(&w.http), "/metrics", &trust);
    let failures: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("weft_tls_handshake_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no handshake counter in {metrics}"));
    assert!(failures >= 2, "{failures}");

    // PostgreSQL: SSLRequest, then verify-full against the CA
    let full = format!("sslmode=verify-full sslrootcert={ca}");
    let out = psql(w.pg, &full, "SELECT count(*) FROM spans");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(text(&out).trim(), "1");
    let out = psql(w.pg, &full, "\\conninfo");
    assert!(text(&out).contains("SSL connection"), "{}", text(&out));
    let out = psql(w.pg, "sslmode=disable", "SELECT 1");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("TLS connections only"),
        "{}",
        text(&out)
    );
    let out = psql(
        w.pg,
        &format!(
            "sslmode=verify-full sslrootcert={}",
            arg(&pki, "other-ca.pem")
        ),
        "SELECT 1",
    );
    assert!(!out.status.success(), "a wrong CA must fail verification");

    // rotation: new files, SIGHUP, new connections get the new certificate
    let subject = || {
        let out = Command::new("openssl")
            .args(["s_client", "-connect"])
            .arg(format!("127.0.0.1:{}", port(&w.http)))
            .args(["-servername", "localhost"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        text(&out)
    };
    assert!(subject().contains("CN=localhost\n") || subject().contains("CN = localhost\n"));
    std::fs::copy(pki.join("rotated.pem"), &cert).unwrap();
    std::fs::copy(pki.join("rotated.key"), &key).unwrap();
    Command::new("kill")
        .args(["-HUP", &w.pid().to_string()])
        .status()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !subject().contains("localhost-rotated") {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not rotate the certificate"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (rc, body) = curl(port(&w.http), "/ready", &trust);
    assert_eq!((rc, body.as_str()), (0, "ready\n\n200"));
    // a broken replacement is refused and the certificate in force stays
    std::fs::write(&cert, "not a certificate").unwrap();
    Command::new("kill")
        .args(["-HUP", &w.pid().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(subject().contains("localhost-rotated"));
}

#[test]
fn a_client_ca_requires_client_certificates_on_every_port() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let (cert, key, client_ca) = (
        arg(&pki, "server.pem"),
        arg(&pki, "server.key"),
        arg(&pki, "ca.pem"),
    );
    let w = Weft::start(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &client_ca,
        ],
    );
    let ca = arg(&pki, "ca.pem");
    let (client, client_key) = (arg(&pki, "client.pem"), arg(&pki, "client.key"));
    let (stranger, stranger_key) = (arg(&pki, "stranger.pem"), arg(&pki, "stranger.key"));
    for (p, path) in [(port(&w.http), "/ready"), (port(&w.otlp), "/v1/traces")] {
        let (rc, body) = curl(p, path, &["--cacert", &ca]);
        assert_ne!(rc, 0, "no client certificate must be refused: {body}");
        let (rc, body) = curl(
            p,
            path,
            &["--cacert", &ca, "--cert", &stranger, "--key", &stranger_key],
        );
        assert_ne!(
            rc, 0,
            "another CA's client certificate must be refused: {body}"
        );
    }
    let with_cert = [
        "--cacert",
        ca.as_str(),
        "--cert",
        &client,
        "--key",
        &client_key,
    ];
    let (rc, body) = curl(port(&w.http), "/ready", &with_cert);
    assert_eq!((rc, body.as_str()), (0, "ready\n\n200"));
    send_span(&w, &with_cert);

    let base = format!("sslmode=verify-full sslrootcert={ca}");
    let out = psql(w.pg, &base, "SELECT 1");
    assert!(!out.status.success(), "psql without a client certificate");
    let out = psql(
        w.pg,
        &format!("{base} sslcert={client} sslkey={client_key}"),
        "SELECT count(*) FROM spans",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(text(&out).trim(), "1");
}

#[test]
fn bad_tls_settings_stop_the_server_with_a_message_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let run = |args: &[String]| -> String {
        let out = Command::new(weft_binary())
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} must not start");
        text(&out)
    };
    let msg = run(&["--tls-cert".into(), arg(&pki, "server.pem")]);
    assert!(msg.contains("--tls-cert needs --tls-key"), "{msg}");
    let msg = run(&[
        "--tls-cert".into(),
        arg(&pki, "server.pem"),
        "--tls-key".into(),
        arg(&pki, "client.key"),
    ]);
    assert!(
        msg.contains("does not fit certificate") && msg.contains("client.key"),
        "{msg}"
    );
    let msg = run(&[
        "--tls-cert".into(),
        arg(&pki, "server.key"),
        "--tls-key".into(),
        arg(&pki, "server.key"),
    ]);
    assert!(msg.contains("no PEM certificate"), "{msg}");
    let msg = run(&["--tls-client-ca".into(), arg(&pki, "ca.pem")]);
    assert!(msg.contains("client certificates need TLS"), "{msg}");
}
