//! The wall clock, behind a seam: the store asks it for "now" (retention cutoffs), and tests
//! move a [`ManualClock`] instead of sleeping. [`SystemClock`] is the one place in Weft that
//! reads the system time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::UnixNanos;

pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> UnixNanos;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixNanos {
        UnixNanos(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        )
    }
}

/// A clock that shows what it is set to (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now: UnixNanos) -> Self {
        Self(AtomicU64::new(now.0))
    }

    pub fn set(&self, now: UnixNanos) {
        self.0.store(now.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixNanos {
        UnixNanos(self.0.load(Ordering::SeqCst))
    }
}
