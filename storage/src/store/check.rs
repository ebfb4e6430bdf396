//! `weft check`: verifies a stopped store without changing it. Opens RocksDB read-only (RocksDB
//! verifies its own block checksums on every read, caches bypassed), verifies the checksum of
//! every block value and head record (see [`crate::seal`]), decodes block metas, trace summaries,
//! trace-id entries, postings and head records, checks that every block has its meta, and lists
//! what is damaged, by tenant, signal and block.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use rocksdb::{DB, IteratorMode, Options, ReadOptions};

use super::{CF_DATA, CF_HEAD, CF_META};
use crate::block::BlockMeta;
use crate::block::format::{decode_postings, decode_traces};
use crate::error::{Result, StorageError};
use crate::keys::{self, BlockAddr, Signal};
use crate::model::{LogRecord, MetricPoint, SpanRecord};
use crate::seal::unseal;
use crate::signal::Row;

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub blocks: usize,
    pub values: usize,
    pub head_records: usize,
    /// One line per damaged thing: where, and what is wrong.
    pub damaged: Vec<String>,
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.damaged {
            writeln!(f, "DAMAGED {d}")?;
        }
        write!(
            f,
            "checked {} blocks ({} values) and {} head records: {}",
            self.blocks,
            self.values,
            self.head_records,
            if self.damaged.is_empty() {
                "no damage found".to_owned()
            } else {
                format!("{} damaged", self.damaged.len())
            }
        )
    }
}

fn place(tenant: &str, signal: Signal, addr: Option<BlockAddr>) -> String {
    match addr {
        Some(a) => format!(
            "tenant {tenant} {} block {}/{}",
            signal.name(),
            a.window,
            a.block
        ),
        None => format!("tenant {tenant} {}", signal.name()),
    }
}

/// Calls `f` on every entry of a column family, RocksDB verifying its checksums (caches
/// bypassed); stops at the first error RocksDB reports, returning it.
fn scan(
    db: &DB,
    cf: &str,
    mut f: impl FnMut(&[u8], &[u8]),
) -> std::result::Result<(), rocksdb::Error> {
    let handle = db.cf_handle(cf).expect("column family opened");
    let mut read = ReadOptions::default();
    read.set_verify_checksums(true);
    read.fill_cache(false);
    for item in db.iterator_cf_opt(handle, read, IteratorMode::Start) {
        let (key, value) = item?;
        f(&key, &value);
    }
    Ok(())
}

/// Verifies the store in `path` (which must not be open elsewhere for writing).
pub fn check(path: &Path) -> Result<CheckReport> {
    if !path.join("CURRENT").exists() {
        return Err(StorageError::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} holds no Weft store", path.display()),
        )));
    }
    let db = DB::open_cf_for_read_only(
        &Options::default(),
        path,
        [CF_DATA, CF_META, CF_HEAD],
        false,
    )?;
    let mut report = CheckReport::default();

    let mut metas = BTreeSet::new();
    let scanned = scan(&db, CF_META, |key, value| {
        let Some(parts) = keys::split(key).filter(|p| p.kind == keys::META) else {
            return;
        };
        let addr = keys::read_addr(parts.rest);
        report.blocks += 1;
        metas.insert((parts.tenant.to_owned(), parts.signal, addr));
        let at = place(parts.tenant, parts.signal, addr);
        let decoded = unseal(value).and_then(|v| BlockMeta::decode(v).map_err(|e| e.to_string()));
        if let Err(e) = decoded {
            report.damaged.push(format!("{at} (block meta): {e}"));
        }
    });
    if let Err(e) = scanned {
        report
            .damaged
            .push(format!("block metas: RocksDB: {e} (scan stopped)"));
    }

    let mut orphans = BTreeSet::new();
    let mut last = String::from("the first key");
    let scanned = scan(&db, CF_DATA, |key, value| {
        let Some(parts) = keys::split(key) else {
            report
                .damaged
                .push(format!("unreadable data key {}", hex::encode(key)));
            return;
        };
        report.values += 1;
        let (addr, part) = match parts.kind {
            keys::TRACE_ID => (
                parts.rest.get(16..).and_then(keys::read_addr),
                "trace-id entry".to_owned(),
            ),
            keys::CHUNK => (
                keys::read_addr(parts.rest),
                format!(
                    "column {}",
                    String::from_utf8_lossy(parts.rest.get(16..).unwrap_or_default())
                ),
            ),
            keys::POSTINGS => (
                keys::read_addr(parts.rest),
                format!(
                    "postings {}",
                    String::from_utf8_lossy(parts.rest.get(16..).unwrap_or_default())
                ),
            ),
            keys::TRACES => (keys::read_addr(parts.rest), "trace summaries".to_owned()),
            _ => (keys::read_addr(parts.rest), "value".to_owned()),
        };
        let at = place(parts.tenant, parts.signal, addr);
        last.clone_from(&at);
        if !metas.contains(&(parts.tenant.to_owned(), parts.signal, addr)) {
            // data of a block taken out (merged, expired) whose deletion is pending
            orphans.insert(at.clone());
            return;
        }
        let decoded = match unseal(value) {
            Err(e) => Err(e),
            Ok(v) => match parts.kind {
                keys::TRACE_ID | keys::TRACES => {
                    decode_traces(v).map(drop).map_err(|e| e.to_string())
                }
                keys::POSTINGS => decode_postings(v).map(drop).map_err(|e| e.to_string()),
                _ => Ok(()),
            },
        };
        if let Err(e) = decoded {
            report.damaged.push(format!("{at} ({part}): {e}"));
        }
    });
    if let Err(e) = scanned {
        report.damaged.push(format!(
            "block data after {last}: RocksDB: {e} (scan stopped there)"
        ));
    }

    let scanned = scan(&db, CF_HEAD, |key, value| {
        report.head_records += 1;
        let Some(parts) = keys::split(key) else {
            report
                .damaged
                .push(format!("unreadable head key {}", hex::encode(key)));
            return;
        };
        let seq = keys::read_u64(parts.rest).unwrap_or_default();
        let at = format!(
            "{} head record {seq}",
            place(parts.tenant, parts.signal, None)
        );
        let decoded = unseal(value).and_then(|v| {
            match parts.signal {
                Signal::Spans => SpanRecord::decode_rows(v).map(drop),
                Signal::Logs => LogRecord::decode_rows(v).map(drop),
                Signal::Metrics => MetricPoint::decode_rows(v).map(drop),
            }
            .map_err(|e| e.to_string())
        });
        if let Err(e) = decoded {
            report.damaged.push(format!("{at}: {e}"));
        }
    });
    if let Err(e) = scanned {
        report
            .damaged
            .push(format!("head: RocksDB: {e} (scan stopped)"));
    }
    if !orphans.is_empty() {
        tracing::info!(
            blocks = orphans.len(),
            "data of blocks taken out, deleted at the next start"
        );
    }
    Ok(report)
}
