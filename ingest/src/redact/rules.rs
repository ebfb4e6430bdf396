//! The personal-data rules. Each finds candidates with a regular expression and, where a
//! pattern alone would over-match, confirms them (payment cards by the Luhn check, IP
//! addresses by parsing them); a confirmed match is replaced by the rule's placeholder.
//! A regex set answers first whether any rule can match a string at all, so that the common
//! value (a model name, a route) costs one scan.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, OnceLock};

use regex::{Captures, Regex, RegexSet};

use super::Counts;

/// A configured pattern that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("redaction pattern {name:?}: {detail}")]
    Invalid { name: String, detail: String },
}

#[derive(Clone, Copy, Debug)]
enum Confirm {
    Always,
    Luhn,
    Ipv4,
    Ipv6,
}

#[derive(Clone, Debug)]
struct Rule {
    name: String,
    placeholder: String,
    regex: Regex,
    confirm: Confirm,
}

/// The rules of one tenant: the built-in ones, then its configured patterns.
#[derive(Clone, Debug)]
pub struct PiiRules {
    rules: Arc<Vec<Rule>>,
    any: Arc<RegexSet>,
}

/// Built-in rules, in the order they apply (keys before the e-mail and number rules that
/// would take parts of them).
const BUILTIN: &[(&str, &str, Confirm)] = &[
    (
        "api_key",
        r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|xox[abpr]-[A-Za-z0-9-]{10,})",
        Confirm::Always,
    ),
    (
        "bearer_token",
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
        Confirm::Always,
    ),
    (
        "email",
        r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
        Confirm::Always,
    ),
    (
        "ip",
        r"(?i)(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?:%[0-9a-z]+)?",
        Confirm::Ipv6,
    ),
    ("ip", r"\b\d{1,3}(?:\.\d{1,3}){3}\b", Confirm::Ipv4),
    // issuers' first digits (2 to 6): a nanosecond timestamp (a 1) is never taken for one
    ("card", r"\b[2-6]\d(?:[ -]?\d){11,17}\b", Confirm::Luhn),
    // with a country code, or a separated (area) exchange line: a bare run of ten digits is
    // more often an epoch time than a phone number
    (
        "phone",
        r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,4}\b|(?:\(\d{3}\)\s?|\b\d{3}[ .-])\d{3}[ .-]\d{4}\b",
        Confirm::Always,
    ),
];

fn builtin_rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        BUILTIN
            .iter()
            .map(|(name, re, confirm)| Rule {
                name: (*name).to_owned(),
                placeholder: format!("<{name}>"),
                regex: Regex::new(re).expect("built-in rule compiles"),
                confirm: *confirm,
            })
            .collect()
    })
}

/// A configured pattern, checked.
pub(super) fn pattern(name: &str, regex: &str) -> Result<(String, Regex), RuleError> {
    let invalid = |detail: String| RuleError::Invalid {
        name: name.to_owned(),
        detail,
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid("a name is letters, digits and underscores".into()));
    }
    let re = Regex::new(regex).map_err(|e| invalid(e.to_string()))?;
    if re.is_match("") {
        return Err(invalid("the pattern matches the empty string".into()));
    }
    Ok((name.to_owned(), re))
}

impl PiiRules {
    /// The built-in rules alone.
    pub fn builtin() -> Self {
        Self::with_patterns(Vec::new())
    }

    /// The built-in rules, then configured patterns (see [`super::pattern`]).
    pub fn with_patterns(patterns: Vec<(String, Regex)>) -> Self {
        let mut rules: Vec<Rule> = builtin_rules().to_vec();
        rules.extend(patterns.into_iter().map(|(name, regex)| Rule {
            placeholder: format!("<{name}>"),
            name,
            regex,
            confirm: Confirm::Always,
        }));
        let any = RegexSet::new(rules.iter().map(|r| r.regex.as_str())).expect("each compiled");
        Self {
            rules: Arc::new(rules),
            any: Arc::new(any),
        }
    }

    /// The text with every confirmed match replaced; `None` when nothing matched.
    pub(super) fn redact<'r>(&'r self, text: &str, counts: &mut Counts<'r>) -> Option<String> {
        let candidates = self.any.matches(text);
        if !candidates.matched_any() {
            return None;
        }
        let mut out: Option<String> = None;
        for i in candidates.iter() {
            let rule = &self.rules[i];
            let current = out.as_deref().unwrap_or(text);
            let mut n = 0;
            let replaced = rule.regex.replace_all(current, |c: &Captures<'_>| {
                let found = &c[0];
                if confirmed(rule.confirm, found) {
                    n += 1;
                    rule.placeholder.clone()
                } else {
                    found.to_owned()
                }
            });
            if n > 0 {
                counts.bump(&rule.name, n);
                out = Some(replaced.into_owned());
            }
        }
        out
    }
}

fn confirmed(confirm: Confirm, found: &str) -> bool {
    match confirm {
        Confirm::Always => true,
        Confirm::Luhn => luhn(found),
        Confirm::Ipv4 => found.parse::<Ipv4Addr>().is_ok(),
        Confirm::Ipv6 => {
            let addr = found.split('%').next().unwrap_or(found);
            addr.matches(':').count() >= 2 && addr.parse::<Ipv6Addr>().is_ok()
        }
    }
}

/// The Luhn check of a card number's digits (13 to 19 of them).
fn luhn(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| match i % 2 {
            1 if d * 2 > 9 => d * 2 - 9,
            1 => d * 2,
            _ => *d,
        })
        .sum();
    sum.is_multiple_of(10)
}
