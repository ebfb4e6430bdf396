//! Logs through the real binary: kill -9 during concurrent log ingest (every acknowledged
//! record is there after restart, once), read back through SQL over HTTP and found by full
//! text.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use weft_tests::Weft;

use crate::common::*;

fn export(sender: u64, batch: u64) -> (String, Vec<String>) {
    let bodies: Vec<String> = (0..50)
        .map(|r| format!("sender s{sender} batch b{batch} record r{r} decode finished"))
        .collect();
    let records: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(r, body)| {
            json!({
                "timeUnixNano": (T0 + batch * 1_000 + r as u64).to_string(),
                "severityText": "INFO",
                "body": { "stringValue": body },
            })
        })
        .collect();
    let doc = json!({ "resourceLogs": [{
        "resource": { "attributes": [{ "key": "service.name", "value": { "stringValue": "crash-logs" } }] },
        "scopeLogs": [{ "logRecords": records }],
    }]});
    (doc.to_string(), bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_log_record_survives_sigkill_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(
        dir.path(),
        &["--flush-rows", "2000", "--flush-age", "200ms"],
    );
    let acked: Arc<Mutex<Vec<String>>> = Default::default();
    let mut tasks = Vec::new();
    for sender in 0..3u64 {
        let (acked, otlp) = (acked.clone(), w.otlp.clone());
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            for batch in 0..100_000u64 {
                let (body, bodies) = export(sender, batch);
                let Ok(r) = c
                    .post(
                        &format!("{otlp}/v1/logs"),
                        &[("content-type", "application/json")],
                        body,
                    )
                    .await
                else {
                    return;
                };
                if r.status == 200 {
                    acked.lock().unwrap().extend(bodies);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.kill9();
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 1000,
        "ingested before the kill: {}",
        acked.len()
    );

    w.restart();
    let c = Client::new();
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[("content-type", "application/json")],
            json!({ "query": "SELECT body FROM logs WHERE service_name = 'crash-logs'", "format": "json" })
                .to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json().unwrap();
    let bodies: Vec<String> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[0].as_str().unwrap().to_owned())
        .collect();
    let unique: HashSet<&String> = bodies.iter().collect();
    assert_eq!(unique.len(), bodies.len(), "no record twice");
    let missing = acked.iter().filter(|b| !unique.contains(b)).count();
    assert_eq!(missing, 0, "of {} acknowledged records", acked.len());

    // full text after the crash (the index caught up at start): every record by a common
    // word, and single acknowledged records by their words, in SQL and in the search API
    let sql = |q: String| {
        let (c, http) = (Client::new(), w.http.clone());
        async move {
            let r = c
                .post(
                    &format!("{http}/api/v1/sql"),
                    &[("content-type", "application/json")],
                    json!({ "query": q, "format": "json" }).to_string(),
                )
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            r.json().unwrap()["rows"][0][0].as_i64().unwrap()
        }
    };
    let all =
        sql("SELECT count(*) FROM logs WHERE matches(body, 'finished AND decode')".into()).await;
    assert_eq!(all as usize, bodies.len());
    for body in acked.iter().step_by(acked.len() / 10) {
        let words: Vec<&str> = body.split(' ').collect();
        let q = format!("{} AND {} AND {}", words[1], words[3], words[5]);
        assert_eq!(
            sql(format!(
                "SELECT count(*) FROM logs WHERE matches(body, '{q}')"
            ))
            .await,
            1,
            "{q}"
        );
        let r = c
            .get(
                &format!(
                    "{}/api/v1/logs/search?q={}&limit=5",
                    w.http,
                    q.replace(' ', "+")
                ),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let found = r.json().unwrap();
        let logs = found["logs"].as_array().unwrap();
        assert_eq!(logs.len(), 1, "{q}");
        assert_eq!(logs[0]["body"].as_str(), Some(body.as_str()));
    }
}

/// Redaction on the generator's data: its log records carry personal data (in prompts, in
/// warnings' text, in attributes) and a few context leaks. Sent to a server that compresses
/// nothing (so that a byte search of its files means something), no planted value may be
/// found in any file of the data directory (write-ahead head before the stop, blocks and
/// text index after it), nor through SQL, log search, a trace's logs or the leak scan; the
/// leak scan reports each planted kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_logs_leave_no_planted_value_on_disk_or_in_a_read_path() {
    use prost::Message;
    use weft_bench::logs::{LogConfig, PLANTED, PLANTED_LEAKS, log_batches};

    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(dir.path(), &["--compression", "none"]);
    let c = Client::new();
    let cfg = LogConfig {
        records: 30_000,
        ..Default::default()
    };
    let mut sent: Vec<u8> = Vec::new();
    for m in log_batches(cfg) {
        let body = m.encode_to_vec();
        sent.extend_from_slice(&body);
        let r = c
            .post(
                &format!("{}/v1/logs", w.otlp),
                &[("content-type", "application/x-protobuf")],
                body,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let contains =
        |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    // every value was sent, or finding none of them proves nothing
    for v in PLANTED {
        assert!(contains(&sent, v), "the generator did not plant {v}");
    }
    let on_disk = |dir: &std::path::Path| -> Vec<&str> {
        let mut files = vec![dir.to_path_buf()];
        let mut found = Vec::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if let Ok(bytes) = std::fs::read(&p) {
                found.extend(PLANTED.iter().filter(|v| contains(&bytes, v)));
            }
        }
        found
    };
    assert_eq!(
        on_disk(dir.path()),
        Vec::<&str>::new(),
        "in the write-ahead head"
    );

    let mut read = String::new();
    read +=
        &serde_json::Value::Array(sql_rows(&c, &w, None, "SELECT * FROM logs").await).to_string();
    let traces = sql_rows(
        &c,
        &w,
        None,
        "SELECT DISTINCT trace_id FROM logs WHERE matches(body, 'rejected OR slow') LIMIT 20",
    )
    .await;
    assert!(!traces.is_empty());
    // an API answer, which must succeed
    let get = async |path: String| -> String {
        let r = c.get(&format!("{}{path}", w.http), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.text()
    };
    for t in &traces {
        let id = t[0].as_str().unwrap();
        read += &get(format!("/api/v1/traces/{id}/logs")).await;
    }
    for q in ["rejected", "slow", "prompt", "exported"] {
        read += &get(format!("/api/v1/logs/search?q={q}&limit=500")).await;
    }
    let leaks = get("/api/v1/leaks?start=2025-11-30T00:00:00Z".into()).await;
    read += &leaks;
    let findings: serde_json::Value = serde_json::from_str(&leaks).unwrap();
    let kinds: HashSet<&str> = findings["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    for kind in PLANTED_LEAKS {
        assert!(kinds.contains(kind), "{kind} not reported: {findings}");
    }
    let leaked: Vec<&&str> = PLANTED.iter().filter(|v| read.contains(*v)).collect();
    assert!(leaked.is_empty(), "read back: {leaked:?}");
    for placeholder in ["<email>", "<phone>", "<card>", "<api_key>", "<ip>"] {
        assert!(
            read.contains(placeholder),
            "{placeholder} not in what was read"
        );
    }
    let m = metrics(&c, &w).await;
    assert!(m.contains("weft_redactions_total{rule=\"email\"}"), "{m}");

    // a clean stop flushes every head into blocks and the text index
    assert!(w.terminate());
    assert_eq!(
        on_disk(dir.path()),
        Vec::<&str>::new(),
        "in blocks or index"
    );
}
