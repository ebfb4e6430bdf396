//! Authentication and tenant binding with `--auth-file`, on every surface of the real binary:
//! OTLP/HTTP, OTLP/gRPC, the query API (native, Tempo, Jaeger, Prometheus, SQL) and the
//! PostgreSQL wire, each with no token, an unknown token, another tenant's token and a token
//! without the scope; `weft token new`, SIGHUP re-reading the file, and the refusal to listen
//! beyond loopback without an auth file.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message;
use weft_bench::pgclient::PgClient;
use weft_tests::{Weft, weft_binary};

use crate::common::*;

/// `weft token new`: the token and the auth-file lines.
fn new_token(tenant: &str, scopes: &str) -> (String, String) {
    let out = std::process::Command::new(weft_binary())
        .args(["token", "new", "--tenant", tenant, "--scopes", scopes])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    let lines = text[text.find("[[token]]").unwrap()..].to_owned();
    (token, lines)
}

fn one_span(trace: u64) -> Vec<u8> {
    request(
        "auth-svc",
        vec![span(
            &id16(trace),
            1,
            None,
            "GET /x",
            1_764_460_800_000_000_000,
            1_764_460_800_100_000_000,
        )],
    )
    .encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_refuses_missing_wrong_and_foreign_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (rw, rw_lines) = new_token("acme", "read,write");
    let (ro, ro_lines) = new_token("acme", "read");
    let (other, other_lines) = new_token("globex", "read,write");
    let (admin, admin_lines) = new_token("*", "read,write");
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!("{rw_lines}\n{ro_lines}\n{other_lines}\n{admin_lines}"),
    )
    .unwrap();
    let w = Weft::start(
        &dir.path().join("data"),
        &["--auth-file", auth.to_str().unwrap()],
    );
    let c = Client::new();
    let bearer = |t: &str| format!("Bearer {t}");

    // OTLP/HTTP: write scope, the token's tenant unless one is named
    let post = |token: Option<String>, tenant: Option<&'static str>, trace: u64| {
        let c = &c;
        let url = format!("{}/v1/traces", w.otlp);
        async move {
            let mut headers = vec![("content-type", "application/x-protobuf".to_owned())];
            if let Some(t) = token {
                headers.push(("authorization", t));
            }
            if let Some(t) = tenant {
                headers.push(("x-scope-orgid", t.to_owned()));
            }
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            c.post(&url, &h, one_span(trace))
                .await
                .unwrap()
                .status
                .as_u16()
        }
    };
    assert_eq!(post(None, None, 1).await, 401);
    assert_eq!(post(Some(bearer("not-a-token")), None, 1).await, 401);
    assert_eq!(post(Some(format!("Basic {rw}")), None, 1).await, 401);
    assert_eq!(post(Some(bearer(&rw)), Some("globex"), 1).await, 403);
    assert_eq!(post(Some(bearer(&ro)), None, 1).await, 403);
    assert_eq!(post(Some(bearer(&rw)), None, 1).await, 200);
    assert_eq!(post(Some(bearer(&rw)), Some("acme"), 2).await, 200);
    assert_eq!(post(Some(bearer(&other)), None, 3).await, 200);

    // OTLP/gRPC: the authorization metadata
    let mut grpc = TraceServiceClient::connect(w.grpc.clone()).await.unwrap();
    let export = |token: Option<&str>, tenant: Option<&str>| {
        let mut req = tonic::Request::new(
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
                one_span(4).as_slice(),
            )
            .unwrap(),
        );
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        if let Some(t) = tenant {
            req.metadata_mut()
                .insert("x-scope-orgid", t.parse().unwrap());
        }
        req
    };
    let code =
        |r: Result<_, tonic::Status>| r.map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code());
    assert_eq!(
        code(grpc.export(export(None, None)).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(grpc.export(export(Some("nope"), None)).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(grpc.export(export(Some(&rw), Some("globex"))).await),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        code(grpc.export(export(Some(&ro), None)).await),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        code(grpc.export(export(Some(&rw), None)).await),
        tonic::Code::Ok
    );

    // the query API: read scope on every route; /ready open; /metrics any valid token
    let get = |path: &str, token: Option<&str>, tenant: Option<&str>| {
        let c = &c;
        let url = format!("{}{path}", w.http);
        let token = token.map(|t| format!("Bearer {t}"));
        let tenant = tenant.map(str::to_owned);
        async move {
            let mut h: Vec<(&str, &str)> = Vec::new();
            if let Some(t) = &token {
                h.push(("authorization", t));
            }
            if let Some(t) = &tenant {
                h.push(("x-scope-orgid", t));
            }
            let r = c.get(&url, &h).await.unwrap();
            (r.status.as_u16(), r.text())
        }
    };
    assert_eq!(get("/ready", None, None).await.0, 200);
    assert_eq!(get("/metrics", None, None).await.0, 401);
    assert_eq!(get("/metrics", Some(&ro), None).await.0, 200);
    for path in [
        "/api/v1/search?limit=10",
        "/api/search?q=%7B%7D",
        "/api/v2/search/tags",
        "/jaeger/api/services",
        "/prometheus/api/v1/labels",
        &format!("/api/v2/traces/{}", hex::encode(id16(1))),
    ] {
        assert_eq!(get(path, None, None).await.0, 401, "{path}");
        assert_eq!(get(path, Some("nope"), None).await.0, 401, "{path}");
        assert_eq!(get(path, Some(&ro), Some("globex")).await.0, 403, "{path}");
        assert_eq!(get(path, Some(&ro), None).await.0, 200, "{path}");
    }
    // each token sees its own tenant's traces; the admin token names any tenant
    let (_, acme) = get("/jaeger/api/services", Some(&ro), None).await;
    assert!(acme.contains("auth-svc"), "{acme}");
    let (status, _) = get(
        &format!("/api/v2/traces/{}", hex::encode(id16(3))),
        Some(&rw),
        None,
    )
    .await;
    assert_eq!(status, 404, "globex's trace is not acme's");
    let (status, _) = get(
        &format!("/api/v2/traces/{}", hex::encode(id16(3))),
        Some(&other),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = get(
        &format!("/api/v2/traces/{}", hex::encode(id16(3))),
        Some(&admin),
        Some("globex"),
    )
    .await;
    assert_eq!(status, 200);
    let sql = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[("content-type", "application/json")],
            r#"{"query": "SELECT 1"}"#.to_owned(),
        )
        .await
        .unwrap();
    assert_eq!(sql.status.as_u16(), 401);

    // PostgreSQL: the token is the password, the database the tenant
    let pg = format!("127.0.0.1:{}", w.pg);
    let refused = |r: anyhow::Result<PgClient>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused(PgClient::connect(&pg, "acme").await).contains("password"));
    assert!(refused(PgClient::connect_with(&pg, "acme", Some("nope")).await).contains("28P01"));
    assert!(refused(PgClient::connect_with(&pg, "globex", Some(&rw)).await).contains("42501"));
    let mut ok = PgClient::connect_with(&pg, "acme", Some(&ro))
        .await
        .unwrap();
    assert_eq!(ok.signed_in_with, "scram-sha-256");
    // acme: traces 1 and 2 over HTTP, 4 over gRPC
    assert_eq!(ok.query("SELECT trace_id FROM spans").await.unwrap(), 3);

    // a new token works once the file is read again (SIGHUP); a broken file keeps the old ones
    let (late, late_lines) = new_token("acme", "read");
    assert_eq!(get("/api/v1/search", Some(&late), None).await.0, 401);
    std::fs::write(&auth, format!("{rw_lines}\n{late_lines}")).unwrap();
    hangup(w.pid());
    let mut status = 0;
    for _ in 0..100 {
        status = get("/api/v1/search", Some(&late), None).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "the new token after SIGHUP");
    assert_eq!(
        get("/api/v1/search", Some(&ro), None).await.0,
        401,
        "a removed token"
    );
    std::fs::write(&auth, "[[token]]\nsha256 = 1").unwrap();
    hangup(w.pid());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        get("/api/v1/search", Some(&late), None).await.0,
        200,
        "kept after a bad file"
    );
}

/// PostgreSQL proves the token with SCRAM-SHA-256 when the auth file carries verifiers (real
/// psql, and the bench client, which checks the server's signature), and takes it as a
/// clear-text password from a file without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_signs_in_with_scram_over_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (acme, acme_lines) = new_token("acme", "read");
    let (admin, admin_lines) = new_token("*", "read");
    let (writer, writer_lines) = new_token("acme", "write");
    assert!(acme_lines.contains("scram_sha256 = \"SCRAM-SHA-256$4096:"));
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!("{acme_lines}\n{admin_lines}\n{writer_lines}"),
    )
    .unwrap();
    let w = Weft::start(
        &dir.path().join("data"),
        &["--auth-file", auth.to_str().unwrap()],
    );
    let pg = format!("127.0.0.1:{}", w.pg);
    let psql = |db: &str, password: &str| {
        let out = std::process::Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={} dbname={db} user=anyone connect_timeout=10",
                w.pg
            ))
            .args(["-X", "-A", "-t", "-c", "SELECT 40 + 2"])
            .env("PGPASSWORD", password)
            .output()
            .expect("psql");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    assert_eq!(psql("acme", &acme).trim(), "42");
    assert_eq!(psql("globex", &admin).trim(), "42");
    let wrong = psql("acme", "not-a-token");
    assert!(
        wrong
            .to_lowercase()
            .contains("password authentication failed"),
        "{wrong}"
    );
    let foreign = psql("globex", &acme);
    assert!(foreign.contains("bound to tenant acme"), "{foreign}");
    let unscoped = psql("acme", &writer);
    assert!(unscoped.contains("lacks the read scope"), "{unscoped}");
    let c = PgClient::connect_with(&pg, "acme", Some(&acme))
        .await
        .unwrap();
    assert_eq!(c.signed_in_with, "scram-sha-256");
    let refused = PgClient::connect_with(&pg, "acme", Some(&admin[1..])).await;
    assert!(refused.err().unwrap().to_string().contains("28P01"));

    // a file without verifiers (an older one): the token as a clear-text password
    let legacy: String = format!("{acme_lines}\n{admin_lines}")
        .lines()
        .filter(|l| !l.starts_with("scram_sha256"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&auth, legacy).unwrap();
    hangup(w.pid());
    let mut method = "";
    for _ in 0..100 {
        method = PgClient::connect_with(&pg, "acme", Some(&acme))
            .await
            .unwrap()
            .signed_in_with;
        if method == "password" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(method, "password");
    assert_eq!(psql("acme", &acme).trim(), "42");
    // a verifier that is not Weft's is refused with the reason, and the tokens in force stay
    std::fs::write(&auth, acme_lines.replace("$4096:", "$8192:")).unwrap();
    let out = std::process::Command::new(weft_binary())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("other"))
        .args(["--auth-file", auth.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scram_sha256 must use Weft's salt"), "{err}");
}

/// Sends SIGHUP (the server reads its auth file again).
fn hangup(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn without_an_auth_file_weft_stays_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let port = weft_tests::free_port();
    let out = std::process::Command::new(weft_binary())
        .args([
            "serve",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--http-listen",
            &format!("0.0.0.0:{port}"),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--insecure-no-auth") && err.contains("--auth-file"),
        "{err}"
    );
}
