//! Free space on the data directory's filesystem. Writes are refused while it is under
//! `min_free` (`--min-free-disk`): RocksDB, once a write fails for want of space, refuses every
//! later write until the process restarts, so the store stops taking rows while a margin is
//! left for the flushes and compactions already under way, and takes them again by itself once
//! space returns (retention, an operator deleting files, a larger volume). Reads never stop.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crate::error::{Result, StorageError};

/// How long a reading of the free space is trusted.
const STALE_MS: u64 = 250;

#[derive(Debug)]
pub struct DiskGuard {
    path: PathBuf,
    min_free: u64,
    epoch: Instant,
    free: AtomicU64,
    /// When `free` was read, in ms since `epoch` (+1, so that 0 means never).
    read_at: AtomicU64,
    warned: AtomicBool,
}

impl DiskGuard {
    pub fn new(path: PathBuf, min_free: u64) -> Self {
        Self {
            path,
            min_free,
            epoch: Instant::now(),
            free: AtomicU64::new(u64::MAX),
            read_at: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// Bytes an unprivileged writer may still use there (`u64::MAX` when it cannot be read).
    pub fn free_bytes(&self) -> u64 {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let at = self.read_at.load(Ordering::Relaxed);
        if at != 0 && now.saturating_sub(at) < STALE_MS {
            return self.free.load(Ordering::Relaxed);
        }
        let free = match rustix::fs::statvfs(&self.path) {
            Ok(s) => s.f_bavail.saturating_mul(s.f_frsize),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(path = %self.path.display(), error = %e, "free disk space unknown; writes are not held back for it");
                }
                u64::MAX
            }
        };
        self.free.store(free, Ordering::Relaxed);
        self.read_at.store(now, Ordering::Relaxed);
        free
    }

    /// `Err(DiskFull)` while the free space is under the minimum.
    pub fn check(&self) -> Result<()> {
        if self.min_free == 0 {
            return Ok(());
        }
        let free = self.free_bytes();
        if free < self.min_free {
            return Err(StorageError::DiskFull {
                free,
                min_free: self.min_free,
            });
        }
        Ok(())
    }
}

/// Whether a RocksDB error is the filesystem running out of space.
pub fn is_out_of_space(e: &rocksdb::Error) -> bool {
    let text = e.to_string();
    text.contains("No space left on device") || text.contains("NoSpace")
}
