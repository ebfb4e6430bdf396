//! The text query language of log search and of SQL's `matches(body, '…')`: terms, phrases
//! (`"charged twice"`), `AND` / `OR` / `NOT` (or a leading `-`), parentheses, field filters
//! (`class:prompt_input`, `service:vllm`, `severity:error`, `model:…`, `model_version:…`,
//! `finish_reason:…`, `worker:…`, `gpu:…`, `event:…`, `trace_id:…`) and prefix terms
//! (`refund*`). Terms are matched case-insensitively against the words of the body (runs of
//! letters, digits and `_`); juxtaposed terms must all match.

use weft_storage::model::{LogRecord, Value};

use crate::error::QueryError;

/// A parsed query.
#[derive(Clone, Debug, PartialEq)]
pub enum TextQuery {
    Term(Field, String),
    Prefix(Field, String),
    Phrase(Field, Vec<String>),
    And(Vec<TextQuery>),
    Or(Vec<TextQuery>),
    Not(Box<TextQuery>),
}

/// What a term is matched against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Body,
    Class,
    Service,
    Severity,
    Model,
    ModelVersion,
    FinishReason,
    Worker,
    Gpu,
    Event,
    TraceId,
    SpanId,
}

const FIELDS: &[(&str, Field)] = &[
    ("body", Field::Body),
    ("class", Field::Class),
    ("service", Field::Service),
    ("severity", Field::Severity),
    ("model", Field::Model),
    ("model_version", Field::ModelVersion),
    ("finish_reason", Field::FinishReason),
    ("worker", Field::Worker),
    ("gpu", Field::Gpu),
    ("event", Field::Event),
    ("trace_id", Field::TraceId),
    ("span_id", Field::SpanId),
];

/// The words of a text, lower-cased.
pub fn words(text: &str) -> Vec<String> {
    weft_storage::text::tokenizer::words(text)
        .map(|(_, w)| w.to_lowercase())
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Phrase(String),
    Open,
    Close,
    Minus,
}

/// Characters a regular expression gives a meaning.
fn regex_meta(c: char) -> bool {
    matches!(
        c,
        '\\' | '.'
            | '+'
            | '*'
            | '?'
            | '('
            | ')'
            | '|'
            | '['
            | ']'
            | '{'
            | '}'
            | '^'
            | '$'
            | '#'
            | '&'
            | '-'
            | '~'
    )
}

fn bad(detail: impl Into<String>) -> QueryError {
    QueryError::InvalidParameter {
        param: "q",
        detail: detail.into(),
    }
}

fn tokens(q: &str) -> Result<Vec<Token>, QueryError> {
    let mut out = Vec::new();
    let mut chars = q.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' | ')' => {
                chars.next();
                out.push(if c == '(' { Token::Open } else { Token::Close });
            }
            '-' if out
                .last()
                .is_none_or(|t| !matches!(t, Token::Word(w) if w.ends_with(':'))) =>
            {
                chars.next();
                out.push(Token::Minus);
            }
            '"' => {
                chars.next();
                let mut phrase = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => phrase.push(c),
                        None => return Err(bad("a phrase is missing its closing quote")),
                    }
                }
                out.push(Token::Phrase(phrase));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '(' || c == ')' || c == '"' {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                out.push(Token::Word(word));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn keyword(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w == k)
    }

    fn or(&mut self) -> Result<TextQuery, QueryError> {
        let mut parts = vec![self.and()?];
        while self.keyword("OR") {
            self.at += 1;
            parts.push(self.and()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            TextQuery::Or(parts)
        })
    }

    fn and(&mut self) -> Result<TextQuery, QueryError> {
        let mut parts = vec![self.unary()?];
        loop {
            if self.keyword("AND") {
                self.at += 1;
            } else if self.peek().is_none()
                || self.keyword("OR")
                || self.peek() == Some(&Token::Close)
            {
                break;
            }
            parts.push(self.unary()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            TextQuery::And(parts)
        })
    }

    fn unary(&mut self) -> Result<TextQuery, QueryError> {
        if self.keyword("NOT") || self.peek() == Some(&Token::Minus) {
            self.at += 1;
            return Ok(TextQuery::Not(Box::new(self.unary()?)));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<TextQuery, QueryError> {
        let token = self
            .peek()
            .cloned()
            .ok_or_else(|| bad("the query ends where a term was expected"))?;
        self.at += 1;
        match token {
            Token::Open => {
                let inner = self.or()?;
                if self.peek() != Some(&Token::Close) {
                    return Err(bad("a parenthesis is not closed"));
                }
                self.at += 1;
                Ok(inner)
            }
            Token::Close => Err(bad("a closing parenthesis has no opening one")),
            Token::Minus => Err(bad("'-' must come before a term")),
            Token::Phrase(p) => phrase(Field::Body, &p),
            Token::Word(w) => match w.split_once(':') {
                Some((name, value)) => {
                    let field = FIELDS
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, f)| *f)
                        .ok_or_else(|| {
                            let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
                            bad(format!(
                                "unknown field {name:?} (fields: {})",
                                names.join(", ")
                            ))
                        })?;
                    if value.is_empty() {
                        return match self.peek().cloned() {
                            Some(Token::Phrase(p)) => {
                                self.at += 1;
                                phrase(field, &p)
                            }
                            _ => Err(bad(format!("field {name:?} has no value"))),
                        };
                    }
                    term(field, value)
                }
                None => term(Field::Body, &w),
            },
        }
    }
}

fn term(field: Field, text: &str) -> Result<TextQuery, QueryError> {
    if let Some(prefix) = text.strip_suffix('*') {
        let w = words(prefix);
        return match w.as_slice() {
            [one] => Ok(TextQuery::Prefix(field, one.clone())),
            _ => Err(bad(format!("prefix {text:?} must be one word then *"))),
        };
    }
    match words(text).as_slice() {
        [] => Err(bad(format!("{text:?} has no word in it"))),
        [one] => Ok(TextQuery::Term(field, one.clone())),
        many => Ok(TextQuery::Phrase(field, many.to_vec())),
    }
}

fn phrase(field: Field, text: &str) -> Result<TextQuery, QueryError> {
    match words(text).as_slice() {
        [] => Err(bad("an empty phrase")),
        w => Ok(TextQuery::Phrase(field, w.to_vec())),
    }
}

impl TextQuery {
    /// The query as the text index runs it (the same words: see `weft_storage::text`): every
    /// record that matches, perhaps more (a phrase under an `OR` or on a field other than the
    /// body is asked as its words, and one under a `NOT` is left out; see
    /// [`Self::index_exact`]); callers check the query on what they read unless it is exact.
    pub fn to_tantivy(
        &self,
        fields: &weft_storage::text::TextFields,
    ) -> Result<Box<dyn tantivy::query::Query>, QueryError> {
        self.index_query(fields, true, false)
    }

    /// [`Self::to_tantivy`]; `positive`: whether a match of this part makes the record match
    /// (false under a `NOT`), so that it is widened (true) or narrowed (false); `union`:
    /// whether it is under an `OR`.
    fn index_query(
        &self,
        fields: &weft_storage::text::TextFields,
        positive: bool,
        union: bool,
    ) -> Result<Box<dyn tantivy::query::Query>, QueryError> {
        use tantivy::Term;
        use tantivy::query::{
            AllQuery, BooleanQuery, EmptyQuery, Occur, PhraseQuery, Query, RegexQuery, TermQuery,
        };
        use tantivy::schema::IndexRecordOption;
        let field = |f: &Field| {
            let name = FIELDS
                .iter()
                .find(|(_, x)| x == f)
                .map(|(n, _)| *n)
                .expect("every field has a name");
            fields.field(name).expect("every query field is indexed")
        };
        let not = |q: Box<dyn Query>| -> Box<dyn Query> {
            Box::new(BooleanQuery::new(vec![
                (Occur::Must, Box::new(AllQuery)),
                (Occur::MustNot, q),
            ]))
        };
        Ok(match self {
            TextQuery::Term(f, t) => Box::new(TermQuery::new(
                Term::from_field_text(field(f), t),
                IndexRecordOption::Basic,
            )),
            TextQuery::Prefix(f, p) => {
                let mut pattern = String::new();
                for c in p.chars() {
                    if regex_meta(c) {
                        pattern.push('\\');
                    }
                    pattern.push(c);
                }
                pattern.push_str(".*");
                Box::new(
                    RegexQuery::from_pattern(&pattern, field(f))
                        .map_err(|e| bad(format!("prefix {p:?}: {e}")))?,
                )
            }
            // tantivy 0.27's phrase scorer trips over a seek backwards inside a union
            // (`target should be greater than or equal to doc`): under an OR a phrase is asked
            // as its words; elsewhere by its positions
            TextQuery::Phrase(f, words) => match (words.as_slice(), positive) {
                ([one], _) => Box::new(TermQuery::new(
                    Term::from_field_text(field(f), one),
                    IndexRecordOption::Basic,
                )),
                ([], _) | (_, false) => Box::new(EmptyQuery),
                (many, true) if !union && *f == Field::Body => Box::new(PhraseQuery::new(
                    many.iter()
                        .map(|w| Term::from_field_text(field(f), w))
                        .collect(),
                )),
                (many, true) => Box::new(BooleanQuery::new(
                    many.iter()
                        .map(|w| -> (Occur, Box<dyn Query>) {
                            (
                                Occur::Must,
                                Box::new(TermQuery::new(
                                    Term::from_field_text(field(f), w),
                                    IndexRecordOption::Basic,
                                )),
                            )
                        })
                        .collect(),
                )),
            },
            TextQuery::Not(inner) => not(inner.index_query(fields, !positive, union)?),
            TextQuery::And(parts) => {
                let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
                for p in parts {
                    clauses.push(match p {
                        TextQuery::Not(inner) => {
                            (Occur::MustNot, inner.index_query(fields, !positive, union)?)
                        }
                        p => (Occur::Must, p.index_query(fields, positive, union)?),
                    });
                }
                if clauses.iter().all(|(o, _)| *o == Occur::MustNot) {
                    clauses.push((Occur::Must, Box::new(AllQuery)));
                }
                Box::new(BooleanQuery::new(clauses))
            }
            TextQuery::Or(parts) => Box::new(BooleanQuery::new(
                parts
                    .iter()
                    .map(|p| Ok((Occur::Should, p.index_query(fields, positive, true)?)))
                    .collect::<Result<Vec<_>, QueryError>>()?,
            )),
        })
    }

    pub fn parse(q: &str) -> Result<Self, QueryError> {
        let mut p = Parser {
            tokens: tokens(q)?,
            at: 0,
        };
        if p.peek().is_none() {
            return Err(bad("the query is empty"));
        }
        let query = p.or()?;
        match p.peek() {
            None => Ok(query),
            Some(Token::Close) => Err(bad("a closing parenthesis has no opening one")),
            Some(t) => Err(bad(format!("unexpected {t:?}"))),
        }
    }

    /// Whether a record matches; `body_words` are the words of its body (computed once).
    pub fn matches(&self, l: &LogRecord, body_words: &[String]) -> bool {
        match self {
            TextQuery::And(parts) => parts.iter().all(|p| p.matches(l, body_words)),
            TextQuery::Or(parts) => parts.iter().any(|p| p.matches(l, body_words)),
            TextQuery::Not(inner) => !inner.matches(l, body_words),
            TextQuery::Term(f, t) => with_words(l, *f, body_words, |w| w.iter().any(|x| x == t)),
            TextQuery::Prefix(f, p) => with_words(l, *f, body_words, |w| {
                w.iter().any(|x| x.starts_with(p.as_str()))
            }),
            TextQuery::Phrase(f, p) => with_words(l, *f, body_words, |w| {
                w.windows(p.len()).any(|x| x == p.as_slice())
            }),
        }
    }

    /// Whether a body matches a query that reads only the body ([`Self::body_only`]). A
    /// necessary condition (the words a conjunction requires appear in the lower-cased text)
    /// is checked first, so most non-matching bodies are never cut into words.
    pub fn matches_body(&self, body: &str) -> bool {
        let lower = body.to_lowercase();
        self.may_match(&lower) && self.on_text(&lower)
    }

    /// Body-only matching on lower-cased text: terms and prefixes are found in place (a hit
    /// must start and end at word boundaries), so only phrases cut the text into words.
    fn on_text(&self, lower: &str) -> bool {
        match self {
            TextQuery::And(parts) => parts.iter().all(|p| p.on_text(lower)),
            TextQuery::Or(parts) => parts.iter().any(|p| p.on_text(lower)),
            TextQuery::Not(inner) => !inner.on_text(lower),
            TextQuery::Term(_, t) => has_word(lower, t, false),
            TextQuery::Prefix(_, p) => has_word(lower, p, true),
            TextQuery::Phrase(_, p) => words(lower).windows(p.len()).any(|w| w == p.as_slice()),
        }
    }

    fn may_match(&self, lower: &str) -> bool {
        match self {
            TextQuery::Term(Field::Body, t) | TextQuery::Prefix(Field::Body, t) => {
                lower.contains(t.as_str())
            }
            TextQuery::Phrase(Field::Body, p) => p.iter().all(|w| lower.contains(w.as_str())),
            TextQuery::And(parts) => parts.iter().all(|p| p.may_match(lower)),
            TextQuery::Or(parts) => parts.iter().any(|p| p.may_match(lower)),
            _ => true,
        }
    }

    /// Whether the text index answers the query exactly: no phrase of several words under an
    /// `OR` or on a field other than the body (asked as its words) and no `NOT` (the index counts a record without a body as
    /// not containing a word; SQL's `matches` gives such a record no answer at all).
    pub fn index_exact(&self) -> bool {
        self.exact_in(false)
    }

    fn exact_in(&self, union: bool) -> bool {
        match self {
            TextQuery::And(p) => p.iter().all(|p| p.exact_in(union)),
            TextQuery::Or(p) => p.iter().all(|p| p.exact_in(true)),
            TextQuery::Not(_) => false,
            TextQuery::Phrase(f, words) => words.len() == 1 || (!union && *f == Field::Body),
            TextQuery::Term(..) | TextQuery::Prefix(..) => true,
        }
    }

    /// Whether the query reads only the body (so that a body-only matcher suffices).
    pub fn body_only(&self) -> bool {
        match self {
            TextQuery::And(p) | TextQuery::Or(p) => p.iter().all(TextQuery::body_only),
            TextQuery::Not(inner) => inner.body_only(),
            TextQuery::Term(f, _) | TextQuery::Prefix(f, _) | TextQuery::Phrase(f, _) => {
                *f == Field::Body
            }
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `text` as a whole word (or, for a prefix, at the start of one).
fn has_word(text: &str, word: &str, prefix: bool) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        before.is_none_or(|c| !is_word_char(c))
            && (prefix || after.is_none_or(|c| !is_word_char(c)))
    })
}

/// The body's text as it is searched (a structured body as JSON).
pub fn body_text(l: &LogRecord) -> String {
    match &l.body {
        Value::Str(s) => s.clone(),
        Value::Empty => String::new(),
        other => other.json(),
    }
}

fn with_words(l: &LogRecord, f: Field, body: &[String], test: impl Fn(&[String]) -> bool) -> bool {
    if f == Field::Body {
        return test(body);
    }
    let s = &l.semantics;
    let text: String = match f {
        Field::Body => unreachable!("handled above"),
        Field::Class => s.class.as_str().to_owned(),
        Field::Service => l.service_name().to_owned(),
        Field::Severity => l.severity_text.clone(),
        Field::Model => s.model.clone().unwrap_or_default(),
        Field::ModelVersion => s.model_version.clone().unwrap_or_default(),
        Field::FinishReason => s.finish_reasons.clone().unwrap_or_default().join(" "),
        Field::Worker => s.worker.clone().unwrap_or_default(),
        Field::Gpu => s.gpu.clone().unwrap_or_default(),
        Field::Event => l.event_name.clone(),
        Field::TraceId => l.trace_id.map(|t| t.to_hex()).unwrap_or_default(),
        Field::SpanId => l.span_id.map(|t| t.to_hex()).unwrap_or_default(),
    };
    // a field value is matched whole as well as by its words (`class:prompt_input`)
    let whole = text.to_lowercase();
    let mut w = words(&text);
    if !w.contains(&whole) {
        w.push(whole);
    }
    test(&w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_storage::model::{LogClass, LogSemantics};

    fn log(body: &str, class: LogClass) -> LogRecord {
        LogRecord {
            body: Value::Str(body.into()),
            semantics: LogSemantics {
                class,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn hit(q: &str, l: &LogRecord) -> bool {
        TextQuery::parse(q)
            .unwrap()
            .matches(l, &words(&body_text(l)))
    }

    #[test]
    fn the_syntax_matches_as_documented() {
        let a = log(
            "Customer was Charged twice; wants a refund",
            LogClass::PromptInput,
        );
        let b = log("refunded after review", LogClass::ResponseOutput);
        for (q, want_a, want_b) in [
            ("refund", true, false),
            ("refund*", true, true),
            (r#"refund AND "charged twice""#, true, false),
            (r#""twice charged""#, false, false),
            ("refund OR refunded", true, true),
            ("refund* NOT twice", false, true),
            ("refund* -twice", false, true),
            ("class:prompt_input", true, false),
            ("(class:response_output OR wants) review", false, true),
            ("customer charged", true, false),
        ] {
            assert_eq!((hit(q, &a), hit(q, &b)), (want_a, want_b), "{q}");
        }
    }

    #[test]
    fn bad_queries_name_the_problem() {
        for (q, says) in [
            ("", "empty"),
            ("\"open", "closing quote"),
            ("(a OR b", "not closed"),
            ("a)", "no opening"),
            ("colour:red", "unknown field"),
            ("a AND", "ends where a term"),
        ] {
            let e = TextQuery::parse(q).unwrap_err().to_string();
            assert!(e.contains(says), "{q}: {e}");
        }
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;

    #[test]
    fn the_body_matcher_agrees_with_the_word_matcher() {
        let bodies = [
            "Customer was Charged twice; wants a refund",
            "refunded after review",
            "prefund_x refund_y",
            "",
            "café crème brûlée, refund!",
        ];
        for q in [
            "refund",
            "refund*",
            "refund OR review",
            "NOT refund",
            r#""charged twice" -refund"#,
            "crème",
            "prefund*",
            "(twice OR café) AND NOT review",
        ] {
            let query = TextQuery::parse(q).unwrap();
            for body in bodies {
                let log = LogRecord {
                    body: Value::Str(body.into()),
                    ..Default::default()
                };
                assert_eq!(
                    query.matches_body(body),
                    query.matches(&log, &words(body)),
                    "{q} on {body:?}"
                );
            }
        }
    }
}
