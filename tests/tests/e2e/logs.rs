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
