//! Redaction settings: `capture_content` and `redact_pii` as flags, variables and keys of a
//! top-level `[redaction]` table, with `content_keys` and `[redaction.patterns]`; the same
//! keys in a tenant's `[tenants.NAME.redaction]` table override the top level for that tenant
//! (a key not set there is inherited).

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use weft_ingest::redact::{self, PiiRules, Redaction, RedactionPolicy};
use weft_storage::model::TenantId;

use super::ConfigError;
use super::retention::RetentionKeys;

/// The redaction keys of one scope.
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct RedactionKeys {
    /// Keep content attributes (prompts, completions) as they came [default: false].
    pub capture_content: Option<bool>,
    /// Replace personal data by placeholders [default: true].
    pub redact_pii: Option<bool>,
    /// Content keys besides the built-in ones.
    pub content_keys: Option<Vec<String>>,
    /// Patterns of personal data besides the built-in ones: name = regex; a match becomes
    /// `<name>`.
    pub patterns: Option<BTreeMap<String, String>>,
}

impl RedactionKeys {
    /// `self`'s keys where set, else `other`'s.
    pub fn or(self, other: RedactionKeys) -> RedactionKeys {
        RedactionKeys {
            capture_content: self.capture_content.or(other.capture_content),
            redact_pii: self.redact_pii.or(other.redact_pii),
            content_keys: self.content_keys.or(other.content_keys),
            patterns: self.patterns.or(other.patterns),
        }
    }

    fn redaction(&self, scope: &str) -> Result<Redaction, ConfigError> {
        let patterns = self
            .patterns
            .iter()
            .flatten()
            .map(|(name, re)| redact::pattern(name, re))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError::Invalid {
                key: "redaction",
                detail: format!("{scope}{e}"),
            })?;
        Ok(Redaction {
            capture_content: self.capture_content.unwrap_or(false),
            content_keys: self.content_keys.clone().unwrap_or_default(),
            pii: self
                .redact_pii
                .unwrap_or(true)
                .then(|| PiiRules::with_patterns(patterns)),
        })
    }
}

/// Every tenant's redaction: the default (flags over variables over the file's
/// `[redaction]`) and the file's `[tenants.NAME.redaction]` tables over it.
pub fn policy(
    default: RedactionKeys,
    tenants: &BTreeMap<String, RetentionKeys>,
) -> Result<RedactionPolicy, ConfigError> {
    let mut out = RedactionPolicy {
        default: default.redaction("")?,
        tenants: HashMap::new(),
    };
    for (name, keys) in tenants {
        let Some(own) = &keys.redaction else {
            continue;
        };
        let tenant = TenantId::new(name).map_err(|e| ConfigError::Invalid {
            key: "tenants",
            detail: e.to_string(),
        })?;
        let merged = own.clone().or(default.clone());
        out.tenants.insert(
            tenant,
            merged.redaction(&format!("tenants.{name}.redaction."))?,
        );
    }
    Ok(out)
}
