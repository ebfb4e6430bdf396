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

type Acked = Arc<Mutex<HashSet<Vec<u8>>>>;

/// Small blocks, merged as soon as a window is idle: kills land in flushes and merges.
const CYCLE_FLAGS: [&str; 6] = [
    "--flush-rows",
    "3000",
    "--flush-age",
    "300ms",
    "--merge-idle",
    "1s",
];

/// Kill cycles: `WEFT_CRASH_CYCLES`, else `default`.
fn crash_cycles(default: u64) -> u64 {
    std::env::var("WEFT_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// When a sender's spans start.
#[derive(Clone, Copy)]
enum Stamp {
    /// At the fixed time `T0`.
    Fixed,
    /// This long before the moment the batch is made.
    Ago(Duration),
}

impl Stamp {
    fn start(self) -> u64 {
        match self {
            Stamp::Fixed => T0,
            Stamp::Ago(d) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap();
                (now - d).as_nanos() as u64
            }
        }
    }
}

/// Sends batch 0, 1, 2, … (200 spans of `service` each, starting as `stamp` says), retrying each
/// until it is acknowledged, to the OTLP/HTTP address `otlp` holds (it changes on restart),
/// until `done`; acknowledged span ids go to `acked`. Two senders with the same `base` send the
/// same batches; senders with different bases, different spans.
fn retrying_sender(
    service: &'static str,
    base: u64,
    stamp: Stamp,
    otlp: Arc<Mutex<String>>,
    acked: Acked,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let c = Client::new();
        let mut batch = base;
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            let t = stamp.start();
            let spans: Vec<_> = (0..200u64)
                .map(|i| {
                    let trace = id16((batch << 4) | (i % 4));
                    span(&trace, (batch << 16) | i, None, "w", t + i, t + i + 5)
                })
                .collect();
            let body = prost::Message::encode_to_vec(&request(service, spans.clone()));
            let url = format!("{}/v1/traces", otlp.lock().unwrap());
            match c
                .post(&url, &[("content-type", "application/x-protobuf")], body)
                .await
            {
                Ok(r) if r.status == 200 => {
                    let mut acked = acked.lock().unwrap();
                    acked.extend(spans.into_iter().map(|s| s.span_id));
                    batch += 1;
                }
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
}

/// Two senders send the same batches (as a client that retries early would), and the server is
/// killed at random moments over several cycles: each acknowledged span is in `spans` exactly
/// once afterwards (counted through SQL, which does not de-duplicate). A retry used to be
/// acknowledged while the first copy was still being written, so a kill between the two lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_acknowledged_to_either_of_two_senders_of_one_batch_survive_kill_cycles() {
    let cycles = crash_cycles(6);
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(dir.path(), &CYCLE_FLAGS);
    let otlp = Arc::new(Mutex::new(w.otlp.clone()));
    let acked: Acked = Default::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _sender in 0..2 {
        tasks.push(retrying_sender(
            "dup-crash",
            0,
            Stamp::Fixed,
            otlp.clone(),
            acked.clone(),
            done.clone(),
        ));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    for _ in 0..cycles {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(200 + seed % 1200)).await;
        w.kill9();
        w.restart();
        *otlp.lock().unwrap() = w.otlp.clone();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, std::sync::atomic::Ordering::Release);
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 1000,
        "ingested before the kills: {}",
        acked.len()
    );

    let stored = stored_span_ids(&w, "dup-crash").await;
    let missing = acked.iter().filter(|id| !stored.contains_key(*id)).count();
    assert_eq!(missing, 0, "acknowledged spans missing of {}", acked.len());
    let twice = stored.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "spans stored more than once");
}

/// How many times each span id of `service` is stored, counted through SQL (which does not
/// de-duplicate).
async fn stored_span_ids(w: &Weft, service: &str) -> HashMap<Vec<u8>, u64> {
    let c = Client::new();
    let query = format!(
        "SELECT span_id, count(*) AS n FROM spans WHERE service_name = '{service}' \
         GROUP BY span_id"
    );
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[("content-type", "application/json")],
            serde_json::json!({ "query": query }).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    let doc = r.json().unwrap();
    let mut stored = HashMap::new();
    for row in doc["rows"].as_array().unwrap() {
        let id = hex::decode(row[0].as_str().unwrap()).unwrap();
        stored.insert(id, row[1].as_u64().unwrap());
    }
    stored
}

/// Kill cycles at random moments of retention as well as of ingest, flush and merge: windows are
/// a minute, the tenant keeps three, and one sender stamps its spans 175 s in the past, so that
/// its blocks fall out of retention seconds after they are written and the retention task
/// (whose first round runs as the server starts) deletes them between and during kills, while
/// another sender sends fresh spans. Afterwards every acknowledged fresh span is stored once,
/// nothing older than the cutoff is served, and `weft check` finds the stopped store sound (no
/// block half deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kills_while_windows_fall_out_of_retention_leave_a_sound_store() {
    let cycles = crash_cycles(6);
    let dir = tempfile::tempdir().unwrap();
    let mut flags = CYCLE_FLAGS.to_vec();
    flags.extend(["--retention", "3m", "--block-window", "1m"]);
    let mut w = Weft::start(dir.path(), &flags);
    let otlp = Arc::new(Mutex::new(w.otlp.clone()));
    let (fresh, old): (Acked, Acked) = Default::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = [
        retrying_sender(
            "ret-fresh",
            0,
            Stamp::Ago(Duration::ZERO),
            otlp.clone(),
            fresh.clone(),
            done.clone(),
        ),
        retrying_sender(
            "ret-old",
            1 << 30,
            Stamp::Ago(Duration::from_secs(175)),
            otlp.clone(),
            old.clone(),
            done.clone(),
        ),
    ];
    let mut seed = 0x6a09_e667_f3bc_c909u64 ^ std::process::id() as u64;
    let mut expired = 0;
    for _ in 0..cycles {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(200 + seed % 1800)).await;
        expired += blocks_expired(&w).await;
        w.kill9();
        w.restart();
        *otlp.lock().unwrap() = w.otlp.clone();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    for t in tasks {
        t.await.unwrap();
    }
    // the last old spans fall out 5 s after they were sent; a restart runs a retention round
    tokio::time::sleep(Duration::from_secs(6)).await;
    expired += blocks_expired(&w).await;
    w.kill9();
    w.restart();
    tokio::time::sleep(Duration::from_secs(1)).await;
    expired += blocks_expired(&w).await;
    assert!(
        expired > 0,
        "no block was deleted by retention during the kill cycles"
    );
    let fresh = fresh.lock().unwrap().clone();
    let old = old.lock().unwrap().clone();
    assert!(
        fresh.len() > 1000 && old.len() > 1000,
        "ingested: {} fresh, {} old",
        fresh.len(),
        old.len()
    );

    let stored = stored_span_ids(&w, "ret-fresh").await;
    let missing = fresh.iter().filter(|id| !stored.contains_key(*id)).count();
    assert_eq!(
        missing,
        0,
        "acknowledged fresh spans missing of {}",
        fresh.len()
    );
    assert!(
        stored.values().all(|&n| n == 1),
        "fresh spans stored more than once"
    );
    let served = stored_span_ids(&w, "ret-old").await;
    assert!(
        served.is_empty(),
        "{} spans older than the retention are served",
        served.len()
    );

    assert!(w.terminate(), "clean stop");
    let check = std::process::Command::new(weft_tests::weft_binary())
        .args(["check", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "weft check: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// Blocks the running server has deleted by retention since it started.
async fn blocks_expired(w: &Weft) -> u64 {
    metrics(&Client::new(), w)
        .await
        .lines()
        .find_map(|l| l.strip_prefix("weft_blocks_expired_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Cuts every file under `data` back to what a power cut would have left, from the shim's log:
/// names that no directory sync made durable are undone (a rename made after its directory's
/// last fsync is reversed and the file it replaced put back; a file created after it is
/// removed; a file deleted after it comes back), then each file is cut back to its size at its
/// last fsync/fdatasync and files never synced are removed.
fn power_cut(data: &std::path::Path, log: &std::path::Path) -> PowerCut {
    use std::path::Path;
    let norm = |p: &str| p.replace("//", "/");
    let parent = |p: &str| {
        Path::new(p)
            .parent()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    struct Renamed {
        at: usize,
        from: String,
        to: String,
        backup: Option<String>,
        /// `to`'s synced size before the rename
        old_size: Option<u64>,
    }
    let mut synced: HashMap<String, u64> = HashMap::new();
    let mut created: HashMap<String, usize> = HashMap::new();
    let mut dir_synced: HashMap<String, usize> = HashMap::new();
    let mut renames: Vec<Renamed> = Vec::new();
    /// A deletion, with what was synced and when the file was created, as of then.
    struct Deleted {
        at: usize,
        path: String,
        backup: Option<String>,
        synced: Option<u64>,
        created: Option<usize>,
    }
    let mut deletions: Vec<Deleted> = Vec::new();
    for (at, line) in std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .enumerate()
    {
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        match parts.as_slice() {
            ["S", size, path] => {
                synced.insert(norm(path), size.parse().unwrap());
            }
            ["C", path] => {
                synced.remove(&norm(path));
                created.insert(norm(path), at);
            }
            ["D", dir] => {
                dir_synced.insert(norm(dir), at);
            }
            ["R", from, to, backup] => {
                let (from, to) = (norm(from), norm(to));
                let old_size = synced.remove(&to);
                if let Some(size) = synced.remove(&from) {
                    synced.insert(to.clone(), size);
                }
                // the new name's durability is the rename's
                created.remove(&to);
                renames.push(Renamed {
                    at,
                    from,
                    to,
                    backup: (*backup != "-").then(|| backup.to_string()),
                    old_size,
                });
            }
            ["U", path, backup] => {
                let path = norm(path);
                deletions.push(Deleted {
                    at,
                    backup: (*backup != "-").then(|| backup.to_string()),
                    synced: synced.remove(&path),
                    created: created.remove(&path),
                    path,
                });
            }
            _ => {}
        }
    }
    let durable = |path: &str, at: usize| dir_synced.get(&parent(path)).is_some_and(|&d| d > at);
    let mut undone = 0;
    for r in renames.iter().rev() {
        if durable(&r.to, r.at) && durable(&r.from, r.at) {
            continue;
        }
        if Path::new(&r.to).exists() {
            std::fs::rename(&r.to, &r.from).unwrap();
            if let Some(size) = synced.remove(&r.to) {
                synced.insert(r.from.clone(), size);
            }
        }
        if let Some(backup) = &r.backup {
            std::fs::rename(backup, &r.to).unwrap();
            if let Some(size) = r.old_size {
                synced.insert(r.to.clone(), size);
            }
        }
        undone += 1;
    }
    for r in &renames {
        if let Some(backup) = &r.backup {
            let _ = std::fs::remove_file(backup);
        }
    }
    // deletions no directory sync made durable: the file is back, as synced and named then
    let mut restored = 0;
    for d in deletions.iter().rev() {
        let Some(backup) = &d.backup else { continue };
        if durable(&d.path, d.at) || Path::new(&d.path).exists() {
            let _ = std::fs::remove_file(backup);
            continue;
        }
        std::fs::rename(backup, &d.path).unwrap();
        match d.synced {
            Some(size) => synced.insert(d.path.clone(), size),
            None => synced.remove(&d.path),
        };
        if let Some(at) = d.created {
            created.insert(d.path.clone(), at);
        }
        restored += 1;
    }
    let (mut cut, mut removed) = (0, 0);
    for (path, len) in files_under(data) {
        let name = norm(path.to_str().unwrap());
        let named = created.get(&name).is_none_or(|&at| durable(&name, at));
        match synced.get(&name) {
            Some(&size) if named && len > size => {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(size).unwrap();
                cut += 1;
            }
            Some(_) if named => {}
            _ => {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
    }
    // what is left is what the disk holds, durably: the next run's log starts from it
    let baseline: String = files_under(data)
        .into_iter()
        .map(|(path, len)| format!("S {len} {}\n", path.display()))
        .collect();
    std::fs::write(log, baseline).unwrap();
    PowerCut {
        cut,
        removed,
        undone,
        restored,
    }
}

/// What a power cut changed on disk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PowerCut {
    /// Files cut back to their last synced size.
    cut: usize,
    /// Files removed: never synced, or created after their directory's last sync.
    removed: usize,
    /// Renames undone.
    undone: usize,
    /// Deleted files brought back.
    restored: usize,
}

/// Every file under `dir` (not directories), with its length.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                dirs.push(path);
            } else {
                files.push((path, meta.len()));
            }
        }
    }
    files
}

/// Power cuts, not just kills: the server runs under an `LD_PRELOAD` shim
/// (`tests/crash/sync_shim.c`) that logs what each file held at its last sync; after each
/// kill -9 every file is cut back to that, and files never synced are removed, so a write
/// acknowledged before it was synced would be lost here, where a plain SIGKILL (which keeps the
/// page cache) would hide it. Every acknowledged span must be there, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_spans_survive_power_cuts_that_drop_unsynced_writes() {
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("sync_shim.so");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crash/sync_shim.c");
    let built = ["cc", "clang"].iter().find_map(|cc| {
        std::process::Command::new(cc)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&shim)
            .arg(&source)
            .arg("-ldl")
            .output()
            .ok()
            .filter(|o| o.status.success())
    });
    if built.is_none() {
        eprintln!("skipped: no C compiler (cc or clang) to build the sync shim");
        return;
    }
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let data = data.canonicalize().unwrap();
    let log = dir.path().join("synced.log");
    let env = [
        ("LD_PRELOAD", shim.to_str().unwrap()),
        ("WEFT_SHIM_ROOT", data.to_str().unwrap()),
        ("WEFT_SHIM_LOG", log.to_str().unwrap()),
    ];
    let mut w = Weft::start_with_env(&data, &CYCLE_FLAGS, &env);
    let otlp = Arc::new(Mutex::new(w.otlp.clone()));
    let acked: Acked = Default::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = retrying_sender(
        "power-cut",
        0,
        Stamp::Fixed,
        otlp.clone(),
        acked.clone(),
        done.clone(),
    );
    let mut seed = 0x2545_f491_4f6c_dd1du64 ^ std::process::id() as u64;
    let mut total = PowerCut::default();
    let (mut synced_logs, mut dir_syncs, mut creations, mut deletions) = (0, 0, 0, 0);
    let cycles = crash_cycles(4);
    for _ in 0..cycles {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(300 + seed % 1200)).await;
        w.kill9();
        let events = std::fs::read_to_string(&log).unwrap_or_default();
        synced_logs += events
            .lines()
            .filter(|l| l.starts_with("S ") && l.ends_with(".log"))
            .count();
        dir_syncs += events.lines().filter(|l| l.starts_with("D ")).count();
        creations += events.lines().filter(|l| l.starts_with("C ")).count();
        deletions += events.lines().filter(|l| l.starts_with("U ")).count();
        let c = power_cut(&data, &log);
        total.cut += c.cut;
        total.removed += c.removed;
        total.undone += c.undone;
        total.restored += c.restored;
        w.restart();
        *otlp.lock().unwrap() = w.otlp.clone();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, std::sync::atomic::Ordering::Release);
    sender.await.unwrap();
    assert!(
        synced_logs > 0,
        "the shim saw no write-ahead log sync: it is not in effect"
    );
    assert!(
        dir_syncs > 0 && creations > 0 && deletions > 0,
        "the shim saw {dir_syncs} directory syncs, {creations} file creations and {deletions} deletions: it does not see them"
    );
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "{cycles} power cuts: {creations} files created, {deletions} deleted, {dir_syncs} directory syncs; {} files cut back, {} files removed (never synced or not yet named durably), {} renames undone, {} deleted files brought back, {} spans acknowledged",
        total.cut,
        total.removed,
        total.undone,
        total.restored,
        acked.len()
    );
    assert!(acked.len() > 1000, "ingested: {}", acked.len());

    let c = Client::new();
    let rows = sql_rows(
        &c,
        &w,
        None,
        "SELECT span_id, count(*) AS n FROM spans WHERE service_name = 'power-cut' GROUP BY span_id",
    )
    .await;
    let stored: HashMap<Vec<u8>, u64> = rows
        .iter()
        .map(|r| {
            (
                hex::decode(r[0].as_str().unwrap()).unwrap(),
                r[1].as_u64().unwrap(),
            )
        })
        .collect();
    let missing = acked.iter().filter(|id| !stored.contains_key(*id)).count();
    assert_eq!(missing, 0, "acknowledged spans lost of {}", acked.len());
    assert_eq!(
        stored.values().filter(|&&n| n > 1).count(),
        0,
        "spans stored twice"
    );
}

/// The power-cut model itself, on a log written by hand: a name is kept only when its
/// directory was synced after it appeared; a rename without that is reversed and the file it
/// replaced comes back; synced sizes hold through renames.
#[test]
fn power_cuts_keep_only_names_a_directory_sync_made_durable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let d = data.to_str().unwrap();
    let write = |name: &str, body: &str| std::fs::write(data.join(name), body).unwrap();
    // CURRENT held "old" (synced, named long ago); a new one was written to a temp file,
    // synced and renamed over it, but the directory was not synced after the rename
    write("CURRENT", "new-current");
    let backup = dir.path().join("backup");
    std::fs::write(&backup, "old").unwrap();
    // a log file created and synced, its directory synced after: kept
    write("000001.log", "abcdef");
    // a table file created and synced after the directory's last sync: not named durably
    write("000002.sst", "table");
    let log = dir.path().join("synced.log");
    std::fs::write(
        &log,
        format!(
            "S 3 {d}/CURRENT\n\
             C {d}/000001.log\nS 6 {d}/000001.log\nD {d}\n\
             C {d}/CURRENT.tmp\nS 11 {d}/CURRENT.tmp\nR {d}/CURRENT.tmp {d}/CURRENT {}\n\
             C {d}/000002.sst\nS 5 {d}/000002.sst\n",
            backup.display()
        ),
    )
    .unwrap();
    let c = power_cut(&data, &log);
    assert_eq!(c.undone, 1);
    assert_eq!(
        std::fs::read_to_string(data.join("CURRENT")).unwrap(),
        "old"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("000001.log")).unwrap(),
        "abcdef"
    );
    // the reversed temp file and the table were created after the last directory sync
    assert!(!data.join("CURRENT.tmp").exists());
    assert!(!data.join("000002.sst").exists());
    assert_eq!((c.cut, c.removed, c.restored), (0, 2, 0));

    // the same rename followed by a directory sync stands
    write("CURRENT", "new-current");
    std::fs::write(
        &log,
        format!(
            "S 3 {d}/CURRENT\nC {d}/CURRENT.tmp\nS 11 {d}/CURRENT.tmp\n\
             R {d}/CURRENT.tmp {d}/CURRENT -\nD {d}\n"
        ),
    )
    .unwrap();
    assert_eq!(power_cut(&data, &log).undone, 0);
    assert_eq!(
        std::fs::read_to_string(data.join("CURRENT")).unwrap(),
        "new-current"
    );

    // deletions: one before the directory's last sync stays deleted; one after it comes back
    // cut to its synced size; a file deleted that was never durably named stays gone
    write("000003.log", "old-log-tail");
    write("000004.log", "older");
    write("000005.sst", "x");
    let keep = |name: &str| {
        let b = dir.path().join(format!("{name}.deleted"));
        std::fs::rename(data.join(name), &b).unwrap();
        b.display().to_string()
    };
    let (b3, b4, b5) = (keep("000003.log"), keep("000004.log"), keep("000005.sst"));
    std::fs::write(
        &log,
        format!(
            "S 7 {d}/000003.log\nS 5 {d}/000004.log\n\
             U {d}/000004.log {b4}\nD {d}\n\
             U {d}/000003.log {b3}\n\
             C {d}/000005.sst\nS 1 {d}/000005.sst\nU {d}/000005.sst {b5}\n"
        ),
    )
    .unwrap();
    let c = power_cut(&data, &log);
    assert_eq!(c.restored, 2, "{c:?}");
    assert_eq!(
        std::fs::read_to_string(data.join("000003.log")).unwrap(),
        "old-log"
    );
    assert!(!data.join("000004.log").exists());
    assert!(
        !data.join("000005.sst").exists(),
        "created and deleted unnamed"
    );
    assert!(!std::path::Path::new(&b4).exists(), "backups are dropped");
}
