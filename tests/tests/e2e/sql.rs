//! SQL end to end: sqllogictest files (answers computed by DuckDB) over HTTP, the HTTP API's
//! formats and errors, limits, and the PostgreSQL endpoint driven by the real `psql`.

use std::path::PathBuf;
use std::process::Command;

use prost::Message;
use serde_json::{Value, json};
use sqllogictest::{DBOutput, DefaultColumnType};
use weft_bench::generator::{GenConfig, batches};
use weft_tests::Weft;

use crate::common::*;

/// The data set of tests/slt: `weft-bench generate --seed 7 --spans 12000 --rate 5`.
fn slt_data() -> GenConfig {
    GenConfig {
        seed: 7,
        spans: 12_000,
        rate: 5.0,
        ..Default::default()
    }
}

async fn load(c: &Client, w: &Weft, cfg: GenConfig) {
    for m in batches(cfg, 1500) {
        let r = c
            .post(
                &format!("{}/v1/traces", w.otlp),
                &[("content-type", "application/x-protobuf")],
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

async fn sql(c: &Client, w: &Weft, query: &str, format: &str) -> Reply {
    c.post(
        &format!("{}/api/v1/sql", w.http),
        &[("content-type", "application/json")],
        json!({ "query": query, "format": format }).to_string(),
    )
    .await
    .unwrap()
}

async fn rows(c: &Client, w: &Weft, query: &str) -> Vec<Value> {
    let r = sql(c, w, query, "json").await;
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    let doc = r.json().unwrap();
    assert!(doc.get("error").is_none(), "{query}: {doc}");
    doc["rows"].as_array().unwrap().clone()
}

/// sqllogictest over the HTTP API's JSON answers.
struct HttpDb {
    client: Client,
    base: String,
}

#[derive(Debug)]
struct DbError(String);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

fn slt_text(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::String(s) if s.is_empty() => "(empty)".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for HttpDb {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DbError> {
        let r = self
            .client
            .post(
                &format!("{}/api/v1/sql", self.base),
                &[("content-type", "application/json")],
                json!({ "query": sql }).to_string(),
            )
            .await
            .map_err(|e| DbError(e.to_string()))?;
        let doc = r
            .json()
            .map_err(|e| DbError(format!("{e}: {}", r.text())))?;
        if let Some(e) = doc.get("error") {
            return Err(DbError(e.to_string()));
        }
        let columns = doc["columns"].as_array().map_or(0, Vec::len);
        let rows = doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(slt_text).collect())
            .collect();
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; columns],
            rows,
        })
    }

    async fn shutdown(&mut self) {}
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_answers_match_duckdb_over_http_and_the_api_behaves() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &["--flush-rows", "4000"]);
    let c = Client::new();
    load(&c, &w, slt_data()).await;

    // sqllogictest files, answers from DuckDB
    let slt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("slt");
    let mut files: Vec<_> = std::fs::read_dir(&slt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(files.len() >= 2);
    for f in files {
        let base = w.http.clone();
        let client = c.clone();
        let mut runner = sqllogictest::Runner::new(move || {
            let (client, base) = (client.clone(), base.clone());
            async move { Ok(HttpDb { client, base }) }
        });
        runner
            .run_file_async(&f)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }

    // JSON: columns with types, int64 as numbers, timestamps RFC 3339 with nanoseconds
    let r = sql(&c, &w, "SELECT trace_id, duration_ns, start_time, parent_span_id, \"llm.token.index\" FROM spans WHERE name = 'llm.decode.token' ORDER BY start_time LIMIT 2", "json").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.content_type, "application/json");
    let doc = r.json().unwrap();
    assert_eq!(
        doc["columns"],
        json!([
            {"name": "trace_id", "type": "string"},
            {"name": "duration_ns", "type": "int64"},
            {"name": "start_time", "type": "timestamp"},
            {"name": "parent_span_id", "type": "string"},
            {"name": "llm.token.index", "type": "int64"},
        ])
    );
    let first = &doc["rows"][0];
    assert!(first[1].is_u64(), "{first}");
    let ts = first[2].as_str().unwrap();
    assert!(
        ts.starts_with("2025-11-30T00:00:") && ts.ends_with('Z') && ts.len() == 30,
        "{ts}"
    );
    assert_eq!(first[4], json!(0));

    // CSV and Arrow IPC carry the same rows
    let q = "SELECT service_name, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1";
    let j = rows(&c, &w, q).await;
    let r = sql(&c, &w, q, "csv").await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/csv"));
    let csv = r.text();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("service_name,n"));
    for (row, line) in j.iter().zip(lines) {
        assert_eq!(line, format!("{},{}", row[0].as_str().unwrap(), row[1]));
    }
    let r = sql(&c, &w, q, "arrow").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/vnd.apache.arrow.stream");
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(r.body.to_vec()), None)
            .unwrap();
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    let n: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(n, j.len());
    // a small answer goes out whole, with its length; a large one streams (chunked)
    assert_eq!(r.content_length, Some(r.body.len() as u64));
    let all = rows(&c, &w, "SELECT count(*) FROM spans").await[0][0]
        .as_u64()
        .unwrap();
    let r = sql(&c, &w, "SELECT * FROM spans", "json").await;
    assert_eq!(r.status, 200);
    assert!(r.body.len() > 256 * 1024, "{}", r.body.len());
    assert_eq!(r.content_length, None);
    let doc = r.json().unwrap();
    assert!(doc.get("error").is_none());
    assert_eq!(doc["rows"].as_array().unwrap().len() as u64, all);

    // schema discovery shows the dynamic columns of this tenant
    let described = rows(&c, &w, "DESCRIBE spans").await;
    let names: Vec<&str> = described.iter().map(|r| r[0].as_str().unwrap()).collect();
    for col in [
        "trace_id",
        "start_time",
        "llm.model_version",
        "worker.id",
        "http.route",
        "tenant.id",
        "attributes",
    ] {
        assert!(names.contains(&col), "{col} missing from {names:?}");
    }
    let tables = rows(&c, &w, "SHOW TABLES").await;
    assert!(tables.iter().any(|r| r[2] == "spans"), "{tables:?}");
    let cols = rows(&c, &w, "SELECT data_type FROM information_schema.columns WHERE table_name = 'spans' AND column_name = 'llm.batch_size'").await;
    assert_eq!(cols, vec![json!(["Int64"])]);

    // errors: what and where
    let r = sql(&c, &w, "SELECT * FROM spans WHERE", "json").await;
    assert_eq!(r.status, 400);
    let e = r.json().unwrap();
    assert!(e["error"].as_str().unwrap().contains("syntax error"), "{e}");
    assert_eq!(e["line"], 1);
    assert!(e["column"].as_u64().is_some(), "{e}");
    let r = sql(&c, &w, "SELECT nope FROM spans", "json").await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("nope"), "{}", r.text());
    for statement in [
        "DROP TABLE spans",
        "INSERT INTO spans (name) VALUES ('x')",
        "COPY spans TO '/tmp/spans.csv'",
        "CREATE TABLE t AS SELECT 1",
    ] {
        let r = sql(&c, &w, statement, "json").await;
        assert_eq!(r.status, 400, "{statement}");
        assert!(
            r.text().contains("only queries are accepted"),
            "{statement}: {}",
            r.text()
        );
    }
    let r = sql(&c, &w, "SELECT 1", "xml").await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("xml"));
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[("content-type", "application/json")],
            "{\"sql\": 1}",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("query"), "{}", r.text());

    // tenancy: another tenant sees nothing of this one
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[
                ("content-type", "application/json"),
                ("x-scope-orgid", "someone-else"),
            ],
            json!({"query": "SELECT count(*) FROM spans"}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.json().unwrap()["rows"], json!([[0]]));

    // the PostgreSQL endpoint with the real psql: \dt, \d spans, a query, Grafana's macros
    let psql = |db: &str, command: &str| -> String {
        let out = Command::new("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &w.pg.to_string(),
                "-U",
                "grafana",
                "-d",
                db,
                "-c",
                command,
            ])
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("psql (installed by scripts/setup.sh)");
        assert!(
            out.status.success(),
            "psql -c {command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let dt = psql("weft", "\\dt");
    assert!(dt.contains("public|spans|table|weft"), "{dt}");
    assert!(dt.contains("public|traces|table|weft"), "{dt}");
    let d = psql("weft", "\\d spans");
    assert!(d.contains("trace_id|text|"), "{d}");
    assert!(d.contains("start_time|timestamp with time zone|"), "{d}");
    assert!(d.contains("llm.batch_size|bigint|"), "{d}");
    assert!(d.contains("gen_ai.response.finish_reasons|text[]|"), "{d}");
    let total = j.iter().map(|r| r[1].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        psql("postgres", "SELECT count(*) FROM spans").trim(),
        total.to_string()
    );
    assert_eq!(
        psql(
            "weft",
            "SELECT current_database(), current_setting('server_version')"
        )
        .trim(),
        "weft|16.4"
    );
    // Grafana's $__timeFilter, $__timeGroupAlias and $__unixEpochFilter, as Grafana expands them
    let grafana = psql(
        "weft",
        "SELECT floor(extract(epoch from start_time)/5)*5 AS \"time\", count(*) AS \"value\" FROM spans \
         WHERE start_time BETWEEN '2025-11-30T00:00:00Z' AND '2025-11-30T01:00:00Z' AND name = 'llm.decode.token' \
         GROUP BY 1 ORDER BY 1",
    );
    let mut grafana_total = 0u64;
    for line in grafana.lines() {
        let (t, n) = line.split_once('|').unwrap();
        assert_eq!(t.parse::<f64>().unwrap() % 5.0, 0.0, "{line}");
        grafana_total += n.parse::<u64>().unwrap();
    }
    let decode = rows(
        &c,
        &w,
        "SELECT count(*) FROM spans WHERE name = 'llm.decode.token'",
    )
    .await;
    assert_eq!(json!(grafana_total), decode[0][0]);
    let epoch = psql(
        "weft",
        "SELECT count(*) FROM spans WHERE extract(epoch from start_time) >= 1764460800 AND extract(epoch from start_time) <= 1764460810",
    );
    assert!(epoch.trim().parse::<u64>().unwrap() > 0);
    let out = Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &w.pg.to_string(),
            "-d",
            "weft",
            "-c",
            "DELETE FROM spans",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only queries are accepted"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_over_its_limits_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(
        dir.path(),
        &[
            "--sql-timeout",
            "2s",
            "--sql-memory-limit",
            "2000000",
            "--pg-password",
            "s3cret",
        ],
    );
    let c = Client::new();
    load(
        &c,
        &w,
        GenConfig {
            seed: 3,
            spans: 6_000,
            ..Default::default()
        },
    )
    .await;
    // a sort of every span's attributes needs more than 2 MB
    let r = sql(
        &c,
        &w,
        "SELECT attributes, resource_attributes, trace_id FROM spans ORDER BY trace_id, name",
        "json",
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("memory"), "{}", r.text());
    // a long cross join (little memory: the spans are the build side, the range streams)
    // runs past 2 s in any build profile (600 billion pairs; a release build takes about 2 s
    // for 6 billion)
    let r = sql(
        &c,
        &w,
        "SELECT count(*) FROM spans a CROSS JOIN range(100000000) r WHERE a.duration_ns % 7 = r.value % 5",
        "json",
    )
    .await;
    assert!(
        r.status == 504 || r.json().is_ok_and(|d| d["error"]["kind"] == "Timeout"),
        "{} {}",
        r.status,
        r.text()
    );
    assert!(r.text().contains("--sql-timeout"), "{}", r.text());
    // the server still answers
    let n = rows(&c, &w, "SELECT count(*) FROM spans").await;
    assert!(n[0][0].as_u64().unwrap() > 5_000);
    // with --pg-password, PostgreSQL clients must give it (md5)
    let psql = |password: &str| {
        Command::new("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-p",
                &w.pg.to_string(),
                "-U",
                "u",
                "-d",
                "weft",
                "-c",
                "SELECT 7",
            ])
            .env("PGPASSWORD", password)
            .output()
            .expect("psql")
    };
    let ok = psql("s3cret");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "7");
    let refused = psql("wrong");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("authentication failed"));
}

/// Admission: at most `--sql-max-concurrent` queries run; one more waits `--sql-queue-wait`,
/// then gets 503 with `Retry-After` (SQLSTATE 53300 over PostgreSQL); PostgreSQL connections
/// past `--pg-max-connections` are refused with 53300; the turns and connections come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_and_connections_over_their_caps_are_refused_and_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let w = weft_tests::Weft::start(
        dir.path(),
        &[
            "--sql-max-concurrent",
            "1",
            "--sql-queue-wait",
            "200ms",
            "--sql-timeout",
            "4s",
            "--pg-max-connections",
            "2",
        ],
    );
    let c = Client::new();
    let slow = {
        let url = format!("{}/api/v1/sql", w.http);
        tokio::spawn(async move {
            let body = serde_json::json!({
                "query": "SELECT count(*) FROM generate_series(1, 20000000000) AS t(x) WHERE x % 7 = 3"
            });
            Client::new()
                .post(
                    &url,
                    &[("content-type", "application/json")],
                    body.to_string(),
                )
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let busy = sql(&c, &w, "SELECT 1", "json").await;
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert!(
        busy.text().contains("--sql-max-concurrent"),
        "{}",
        busy.text()
    );
    assert_eq!(busy.retry_after.as_deref(), Some("1"));
    let pg = format!("127.0.0.1:{}", w.pg);
    let mut one = weft_bench::pgclient::PgClient::connect(&pg, "weft")
        .await
        .unwrap();
    let err = one.query("SELECT 1").await.unwrap_err().to_string();
    assert!(err.contains("53300"), "{err}");
    // the slow query ends (its time limit), and its turn comes back
    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 504, "{}", slow.text());
    assert_eq!(one.query("SELECT 1").await.unwrap(), 1);

    // connections: two open, the third refused with PostgreSQL's own message
    let two = weft_bench::pgclient::PgClient::connect(&pg, "weft")
        .await
        .unwrap();
    let third = weft_bench::pgclient::PgClient::connect(&pg, "weft").await;
    let err = third
        .err()
        .expect("a third connection is refused")
        .to_string();
    assert!(
        err.contains("53300") && err.contains("too many clients"),
        "{err}"
    );
    drop(two);
    let mut again = None;
    for _ in 0..50 {
        again = weft_bench::pgclient::PgClient::connect(&pg, "weft")
            .await
            .ok();
        if again.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        again
            .expect("a connection after one closed")
            .query("SELECT 1")
            .await
            .unwrap(),
        1
    );
}
