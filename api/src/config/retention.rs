//! Retention settings: `retention` (every signal) and `spans_retention` / `logs_retention` /
//! `metrics_retention` as flags, variables and top-level keys, and the same four keys per
//! tenant in `[tenants.NAME]` tables of the TOML file. Durations take `s`, `m`, `h`, `d`
//! suffixes; `0` keeps rows forever.

use std::collections::BTreeMap;

use serde::Deserialize;
use weft_storage::Signal;
use weft_storage::model::TenantId;
use weft_storage::retention::{Retention, RetentionRule};

use super::ConfigError;
use crate::time::parse_duration;

/// The four retention keys of one scope (the top level, or one tenant's table; a tenant's
/// table also holds its `redaction` table, see [`super::redaction`]).
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct RetentionKeys {
    pub retention: Option<String>,
    pub spans_retention: Option<String>,
    pub logs_retention: Option<String>,
    pub metrics_retention: Option<String>,
    pub redaction: Option<super::redaction::RedactionKeys>,
}

impl RetentionKeys {
    /// `self`'s keys where set, else `other`'s.
    pub fn or(self, other: RetentionKeys) -> RetentionKeys {
        RetentionKeys {
            retention: self.retention.or(other.retention),
            spans_retention: self.spans_retention.or(other.spans_retention),
            logs_retention: self.logs_retention.or(other.logs_retention),
            metrics_retention: self.metrics_retention.or(other.metrics_retention),
            redaction: self.redaction.or(other.redaction),
        }
    }

    /// Parsed; `scope` names where the keys came from in error messages.
    fn rule(&self, scope: &str) -> Result<RetentionRule, ConfigError> {
        let parse = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|text| {
                    parse_duration(text).map_err(|detail| ConfigError::Invalid {
                        key: "retention",
                        detail: format!("{scope}{key}: {detail}"),
                    })
                })
                .transpose()
        };
        let mut rule = RetentionRule {
            all: parse("retention", &self.retention)?,
            ..Default::default()
        };
        for (signal, key, value) in [
            (Signal::Spans, "spans_retention", &self.spans_retention),
            (Signal::Logs, "logs_retention", &self.logs_retention),
            (
                Signal::Metrics,
                "metrics_retention",
                &self.metrics_retention,
            ),
        ] {
            if let Some(d) = parse(key, value)? {
                rule.by_signal.insert(signal, d);
            }
        }
        Ok(rule)
    }
}

/// The retention of every tenant: the default (flags over variables over the file) and the
/// file's per-tenant tables.
pub fn retention(
    default: RetentionKeys,
    tenants: &BTreeMap<String, RetentionKeys>,
) -> Result<Retention, ConfigError> {
    let mut out = Retention {
        default: default.rule("")?,
        ..Default::default()
    };
    for (name, keys) in tenants {
        let tenant = TenantId::new(name).map_err(|e| ConfigError::Invalid {
            key: "tenants",
            detail: e.to_string(),
        })?;
        out.tenants
            .insert(tenant, keys.rule(&format!("tenants.{name}."))?);
    }
    Ok(out)
}
