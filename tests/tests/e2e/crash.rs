//! kill -9 during concurrent ingest: every acknowledged span is there after restart, once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weft_tests::Weft;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_span_survives_sigkill_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // small blocks, so flushes happen while we ingest and the kill can land in one
    let mut w = Weft::start(
        dir.path(),
        &["--flush-rows", "2000", "--flush-age", "200ms"],
    );
    // trace id -> acknowledged span ids
    type Acked = Arc<Mutex<HashMap<Vec<u8>, HashSet<Vec<u8>>>>>;
    let acked: Acked = Default::default();
    let mut tasks = Vec::new();
    for sender in 0..4u64 {
        let (acked, otlp) = (acked.clone(), w.otlp.clone());
        tasks.push(tokio::spawn(async move {
            let c = Client::new();
            for batch in 0..10_000u64 {
                // each batch: 5 traces of 100 spans, some traces continued by the next batch
                let mut spans = Vec::new();
                for t in 0..5u64 {
                    let trace = id16(sender << 40 | (batch / 2) << 8 | t);
                    for i in 0..100u64 {
                        let n = (batch % 2) * 100 + i;
                        spans.push(span(
                            &trace,
                            sender << 48 | batch << 16 | t << 8 | i,
                            None,
                            "work",
                            T0 + n,
                            T0 + n + 10,
                        ));
                    }
                }
                let req = request("crash-test", spans.clone());
                let body = prost::Message::encode_to_vec(&req);
                let Ok(r) = c
                    .post(
                        &format!("{otlp}/v1/traces"),
                        &[("content-type", "application/x-protobuf")],
                        body,
                    )
                    .await
                else {
                    return;
                };
                if r.status != 200 {
                    continue;
                }
                let mut acked = acked.lock().unwrap();
                for s in spans {
                    acked.entry(s.trace_id).or_default().insert(s.span_id);
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
    let total: usize = acked.values().map(HashSet::len).sum();
    assert!(
        total > 1000,
        "the test ingested something before the kill: {total}"
    );

    w.restart();
    let c = Client::new();
    for (trace, want) in &acked {
        let got = get_trace_proto(&c, &w, trace, None)
            .await
            .expect("acknowledged trace is present");
        let spans = flatten(&got);
        let ids: Vec<Vec<u8>> = spans.iter().map(|(_, s)| s.span_id.clone()).collect();
        let unique: HashSet<Vec<u8>> = ids.iter().cloned().collect();
        assert_eq!(unique.len(), ids.len(), "no span twice");
        assert!(
            want.is_subset(&unique),
            "trace {}: {} acknowledged spans missing",
            hex::encode(trace),
            want.difference(&unique).count()
        );
    }
    let found = search(&c, &w, "service=crash-test&limit=1000", None).await;
    for t in found["traces"].as_array().unwrap() {
        let id = hex::decode(t["trace_id"].as_str().unwrap()).unwrap();
        if let Some(want) = acked.get(&id) {
            assert!(t["span_count"].as_u64().unwrap() as usize >= want.len());
            assert!(
                t["span_count"].as_u64().unwrap() <= 200,
                "span_count counts each span once: {t}"
            );
        }
    }
}
