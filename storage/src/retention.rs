//! How long rows are kept: a default, per signal, and per tenant (and signal) overrides. A row
//! older than its tenant's retention (by start time for spans) is never returned by a read; a
//! time window that has fallen wholly out is deleted by the store's retention task.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::keys::Signal;
use crate::model::{TenantId, UnixNanos};

/// Retention of one scope (everything, or one tenant): for all its signals and per signal.
/// `None` inherits from the wider scope; a zero duration keeps rows forever.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionRule {
    pub all: Option<Duration>,
    pub by_signal: BTreeMap<Signal, Duration>,
}

impl RetentionRule {
    fn for_signal(&self, signal: Signal) -> Option<Duration> {
        self.by_signal.get(&signal).copied().or(self.all)
    }
}

/// The retention of every tenant and signal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    pub default: RetentionRule,
    pub tenants: BTreeMap<TenantId, RetentionRule>,
}

impl Retention {
    /// How long a tenant's rows of a signal are kept; `None` when forever. The most specific
    /// setting wins: the tenant's for the signal, the tenant's, the signal's, the default.
    pub fn of(&self, tenant: &TenantId, signal: Signal) -> Option<Duration> {
        let tenant = self.tenants.get(tenant);
        tenant
            .and_then(|t| t.by_signal.get(&signal).copied())
            .or_else(|| tenant.and_then(|t| t.all))
            .or_else(|| self.default.for_signal(signal))
            .filter(|d| !d.is_zero())
    }

    /// The oldest start time a read may return at `now`; `None` when everything is kept.
    pub fn cutoff(&self, tenant: &TenantId, signal: Signal, now: UnixNanos) -> Option<UnixNanos> {
        self.of(tenant, signal)
            .map(|d| UnixNanos(now.0.saturating_sub(d.as_nanos() as u64)))
    }

    /// Whether any tenant may have a retention (so the retention task has work to look for).
    pub fn is_set(&self) -> bool {
        let set = |r: &RetentionRule| {
            r.all.is_some_and(|d| !d.is_zero()) || r.by_signal.values().any(|d| !d.is_zero())
        };
        set(&self.default) || self.tenants.values().any(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_setting_wins_and_zero_keeps_forever() {
        let day = Duration::from_secs(86_400);
        let acme = TenantId::new("acme").unwrap();
        let other = TenantId::new("other").unwrap();
        let r = Retention {
            default: RetentionRule {
                all: Some(30 * day),
                by_signal: [(Signal::Logs, 7 * day)].into(),
            },
            tenants: [(
                acme.clone(),
                RetentionRule {
                    all: Some(Duration::ZERO),
                    by_signal: [(Signal::Metrics, day)].into(),
                },
            )]
            .into(),
        };
        assert_eq!(r.of(&other, Signal::Spans), Some(30 * day));
        assert_eq!(r.of(&other, Signal::Logs), Some(7 * day));
        assert_eq!(r.of(&acme, Signal::Spans), None, "acme keeps spans forever");
        assert_eq!(r.of(&acme, Signal::Logs), None);
        assert_eq!(r.of(&acme, Signal::Metrics), Some(day));
        assert_eq!(
            r.cutoff(&other, Signal::Spans, UnixNanos(31 * 86_400_000_000_000)),
            Some(UnixNanos(86_400_000_000_000))
        );
        assert!(r.is_set());
        assert!(!Retention::default().is_set());
    }
}
