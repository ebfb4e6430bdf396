//! A full disk, on a small tmpfs the test mounts: writes are refused with 507 /
//! `RESOURCE_EXHAUSTED` and a message that says why, reads go on, nothing acknowledged is lost,
//! and ingest resumes by itself once space returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use weft_tests::Weft;

use crate::common::*;

/// Unmounts on drop (after the server using it is gone).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Free bytes on the filesystem holding `path`.
fn available(path: &Path) -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut it = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

fn batch(n: u64) -> Vec<u8> {
    let spans = (0..100u64)
        .map(|i| span(&id16(n), n << 16 | i, None, "work", T0 + i, T0 + i + 5))
        .collect();
    prost::Message::encode_to_vec(&request("disk", spans))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256m", "tmpfs"])
        .arg(&mnt)
        .output();
    match mount {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("skipped: cannot mount a tmpfs here (root is needed): {other:?}");
            return;
        }
    }
    let _mounted = Mounted(mnt.clone());
    let min_free = 32u64 << 20;
    let mut w = Weft::start(
        &mnt.join("data"),
        &["--min-free-disk", &min_free.to_string()],
    );
    let c = Client::new();
    let post = |n: u64| {
        let (c, url) = (&c, format!("{}/v1/traces", w.otlp));
        async move {
            c.post(
                &url,
                &[("content-type", "application/x-protobuf")],
                batch(n),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(post(1).await.status, 200);

    // the disk fills up (something else writes to it) to under the margin
    let ballast = mnt.join("ballast");
    let fill = available(&mnt) - min_free / 2;
    let out = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", ballast.display()))
        .arg(format!("count={}", fill >> 20))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(available(&mnt) < min_free);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let refused = post(2).await;
    assert_eq!(refused.status, 507, "{}", refused.text());
    assert!(
        refused.text().contains("--min-free-disk"),
        "{}",
        refused.text()
    );
    let mut grpc = TraceServiceClient::connect(w.grpc.clone()).await.unwrap();
    let status = grpc
        .export(request(
            "disk",
            vec![span(&id16(3), 3, None, "w", T0, T0 + 1)],
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // reads go on, and what was acknowledged is there
    let rows = sql_rows(&c, &w, None, "SELECT count(*) FROM spans").await;
    assert_eq!(rows[0][0], 100);
    let m = metrics(&c, &w).await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("weft_writes_refused_disk_full_total ") && !l.ends_with(" 0")),
        "{m}"
    );

    // space returns: ingest resumes by itself
    std::fs::remove_file(&ballast).unwrap();
    let mut status = 0;
    for n in 10..100 {
        status = post(n).await.status.as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "writes resume once space returns");
    let rows = sql_rows(&c, &w, None, "SELECT count(*) FROM spans").await;
    assert_eq!(rows[0][0], 200);
    assert!(w.terminate(), "a clean stop after a full disk");
}
