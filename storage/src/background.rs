//! Background work the store owns (flush today; merge and retention run the same way), each
//! task on its own thread under a supervisor: a task that fails or panics is logged, counted
//! (see [`TaskStats`], shown in `/metrics`) and run again after a back-off that doubles up to
//! [`MAX_BACKOFF`], so that it never stops silently. Stopping wakes every task and joins it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Result;
use crate::store::Store;

/// How long writes must have stopped before the memtables are flushed.
pub const IDLE_RELEASE: Duration = Duration::from_secs(30);
/// How long an idle tenant keeps its last flushed head's row identities (retries of a batch
/// arriving this soon after its flush are still stored once).
pub const RECENT_KEEP: Duration = Duration::from_secs(300);

/// Longest wait before a failed task runs again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Counters of one background task.
#[derive(Debug, Default)]
pub struct TaskStats {
    /// Runs that did some work (a flush that wrote blocks).
    pub runs: AtomicU64,
    /// Runs that returned an error.
    pub failures: AtomicU64,
    /// Runs that panicked.
    pub panics: AtomicU64,
}

/// One background task: what it does each round and how often it looks for work.
#[derive(Clone, Copy)]
pub struct Task {
    pub name: &'static str,
    pub every: Duration,
    /// Does one round of work; `Ok(true)` when it did something.
    pub round: fn(&Store) -> Result<bool>,
}

/// The tasks every store runs.
pub fn tasks() -> [Task; 4] {
    [
        // heads into blocks when due; once writes have stopped for a while, RocksDB's
        // memtables too, so that its write-ahead files are released
        Task {
            name: "flush",
            every: Duration::from_millis(100),
            round: |store| {
                let flushed = store.flush_due() && store.flush(false)? > 0;
                let released = store.release_recent(RECENT_KEEP);
                Ok(store.release_idle(IDLE_RELEASE)? || flushed || released)
            },
        },
        // the text index follows the flushed log blocks
        Task {
            name: "index",
            every: Duration::from_millis(500),
            round: |store| Ok(store.index_pending()),
        },
        Task {
            name: "merge",
            every: Duration::from_secs(5),
            round: Store::merge_small_blocks,
        },
        // a window that falls out of retention is gone well within a minute
        Task {
            name: "retention",
            every: Duration::from_secs(10),
            round: Store::enforce_retention,
        },
    ]
}

impl Store {
    /// Starts the store's background tasks ([`tasks`]); stop them before [`Store::close`].
    pub fn start_background(self: &Arc<Self>) -> Background {
        Background::start(self.clone(), &tasks())
    }
}

/// Wakes sleeping tasks when the store stops.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Sleeps up to `d`; returns whether the tasks must stop.
    fn sleep(&self, d: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, d, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        *stopped
    }
}

/// The running background tasks of a store; [`Background::stop`] (or drop) ends them.
pub struct Background {
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
    stopped: AtomicBool,
}

impl Background {
    /// Starts `tasks` for `store`, one supervised thread each.
    pub fn start(store: Arc<Store>, tasks: &[Task]) -> Self {
        let stop = Arc::new(Stop::default());
        let threads = tasks
            .iter()
            .map(|&task| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("weft-{}", task.name))
                    .spawn(move || supervise(&store, task, &stop))
                    .expect("spawn a background thread")
            })
            .collect();
        Self {
            stop,
            threads,
            stopped: AtomicBool::new(false),
        }
    }

    /// Tells every task to stop and waits until each has finished its round.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.stop.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Runs a task's rounds until told to stop, backing off after each failure.
fn supervise(store: &Store, task: Task, stop: &Stop) {
    let stats = store.stats.task(task.name);
    let mut backoff = FIRST_BACKOFF;
    // the first round runs at start: a server restarted more often than a task's period (a
    // crash loop) still merges and enforces retention
    let mut wait = Duration::ZERO;
    while !stop.sleep(wait) {
        match catch_unwind(AssertUnwindSafe(|| (task.round)(store))) {
            Ok(Ok(worked)) => {
                if worked {
                    stats.runs.fetch_add(1, Ordering::Relaxed);
                }
                backoff = FIRST_BACKOFF;
                wait = task.every;
            }
            Ok(Err(e)) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(task = task.name, error = %e, retry_in_ms = backoff.as_millis() as u64, "background task failed");
                wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(panic) => {
                stats.panics.fetch_add(1, Ordering::Relaxed);
                let what = panic_message(&panic);
                tracing::error!(task = task.name, panic = %what, retry_in_ms = backoff.as_millis() as u64, "background task panicked");
                wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
