//! The TraceQL parser: text to [`Query`]. A query outside the supported subset is an error that
//! names the part it could not take, and where.

use super::TraceQlError;
use super::ast::*;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LBrace,
    RBrace,
    LParen,
    RParen,
    Pipe,
    Comma,
    Eq,
    Ne,
    Re,
    NotRe,
    Lt,
    Le,
    Gt,
    Ge,
    Desc,
    Anc,
    Tilde,
    AndAnd,
    OrOr,
    Bang,
    Str(String),
    Num(String),
    Duration(u64),
    /// An identifier, an attribute path or an intrinsic (`span.http.route`, `.x`,
    /// `trace:rootService`, `count`).
    Word(String),
}

struct Lexed {
    tok: Tok,
    at: usize,
}

fn lex(text: &str) -> Result<Vec<Lexed>, TraceQlError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let at = i;
        let two = |s: &str| text[i..].starts_with(s);
        let (tok, len) = if two("&&") {
            (Tok::AndAnd, 2)
        } else if two("||") {
            (Tok::OrOr, 2)
        } else if two("!=") {
            (Tok::Ne, 2)
        } else if two("=~") {
            (Tok::Re, 2)
        } else if two("!~") {
            (Tok::NotRe, 2)
        } else if two("<=") {
            (Tok::Le, 2)
        } else if two(">=") {
            (Tok::Ge, 2)
        } else if two(">>") {
            (Tok::Desc, 2)
        } else if two("<<") {
            (Tok::Anc, 2)
        } else {
            match c {
                b'{' => (Tok::LBrace, 1),
                b'}' => (Tok::RBrace, 1),
                b'(' => (Tok::LParen, 1),
                b')' => (Tok::RParen, 1),
                b'|' => (Tok::Pipe, 1),
                b',' => (Tok::Comma, 1),
                b'=' => (Tok::Eq, 1),
                b'<' => (Tok::Lt, 1),
                b'>' => (Tok::Gt, 1),
                b'~' => (Tok::Tilde, 1),
                b'!' => (Tok::Bang, 1),
                b'"' | b'`' => {
                    let (s, len) = string(&text[i..], c)
                        .ok_or_else(|| TraceQlError::at(at, "unterminated string"))?;
                    (Tok::Str(s), len)
                }
                b'0'..=b'9' | b'-' if c != b'-' || b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                    number(&text[i..]).map_err(|m| TraceQlError::at(at, m))?
                }
                b'.' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                    number(&text[i..]).map_err(|m| TraceQlError::at(at, m))?
                }
                _ if is_word(c) => {
                    let len = text[i..]
                        .bytes()
                        .position(|c| !is_word(c))
                        .unwrap_or(b.len() - i);
                    let mut word = text[i..i + len].to_owned();
                    let mut len = len;
                    // a quoted attribute name: `span."name with spaces"`
                    if word.ends_with('.') && b.get(i + len) == Some(&b'"') {
                        let (s, n) = string(&text[i + len..], b'"')
                            .ok_or_else(|| TraceQlError::at(at, "unterminated string"))?;
                        word.push_str(&s);
                        len += n;
                    }
                    (Tok::Word(word), len)
                }
                _ => {
                    return Err(TraceQlError::at(
                        at,
                        format!(
                            "unexpected character {:?}",
                            text[i..].chars().next().unwrap()
                        ),
                    ));
                }
            }
        };
        out.push(Lexed { tok, at });
        i += len;
    }
    Ok(out)
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'/' | b'-' | b'@') || c >= 0x80
}

/// A quoted string starting at `s[0]`: its value and length in bytes.
fn string(s: &str, quote: u8) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            c if c as u32 == quote as u32 => return Some((out, i + 1)),
            '\\' if quote == b'"' => {
                let (_, e) = chars.next()?;
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    other => other,
                });
            }
            c => out.push(c),
        }
    }
    None
}

/// A number or a duration (`12`, `-3.5`, `250ms`, `1.5s`, `1h30m`).
fn number(s: &str) -> Result<(Tok, usize), String> {
    let len = s
        .char_indices()
        .skip(1)
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '.' || *c == 'µ'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let text = &s[..len];
    if text
        .chars()
        .last()
        .is_some_and(|c| c.is_ascii_digit() || c == '.')
        && !text.contains(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
    {
        return Ok((Tok::Num(text.to_owned()), len));
    }
    parse_duration(text)
        .map(|ns| (Tok::Duration(ns), len))
        .ok_or_else(|| format!("{text:?} is neither a number nor a duration"))
}

/// Go-style durations: `300ms`, `1.5h`, `2h45m`, units ns, us, µs, ms, s, m, h.
pub fn parse_duration(text: &str) -> Option<u64> {
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Some(total.round() as u64)
}

struct Parser<'a> {
    text: &'a str,
    toks: Vec<Lexed>,
    pos: usize,
    /// Parentheses, negations and pipelines open now.
    depth: usize,
    /// Comparisons, spansets and stages read so far.
    nodes: usize,
}

/// How deeply parentheses and negations may nest (the parser recurses once per level).
const MAX_DEPTH: usize = 64;
/// Comparisons, spansets and stages in one query (each becomes SQL, evaluated recursively).
const MAX_NODES: usize = 512;

/// Parses a whole query.
pub fn parse(text: &str) -> Result<Query, TraceQlError> {
    let mut p = Parser {
        text,
        toks: lex(text)?,
        pos: 0,
        depth: 0,
        nodes: 0,
    };
    if p.toks.is_empty() {
        return Err(TraceQlError::at(0, "empty query (try `{ }`)"));
    }
    let mut q = p.query()?;
    q.hints = p.hints()?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected("the end of the query"));
    }
    Ok(q)
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek_at(&self, n: usize) -> Option<&Tok> {
        self.toks.get(self.pos + n).map(|t| &t.tok)
    }

    fn at(&self) -> usize {
        self.toks
            .get(self.pos)
            .map(|t| t.at)
            .unwrap_or(self.text.len())
    }

    /// Enters one more nesting level, or refuses a query nested too deeply.
    fn enter(&mut self) -> Result<(), TraceQlError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(TraceQlError::at(
                self.at(),
                format!("nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        Ok(())
    }

    /// Counts one more comparison or spanset, or refuses a query with too many.
    fn node(&mut self) -> Result<(), TraceQlError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(TraceQlError::at(
                self.at(),
                format!("more than {MAX_NODES} conditions, spansets and stages in one query"),
            ));
        }
        Ok(())
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, t: Tok, what: &str) -> Result<(), TraceQlError> {
        if self.eat(&t) {
            Ok(())
        } else {
            Err(self.unexpected(what))
        }
    }

    fn unexpected(&self, wanted: &str) -> TraceQlError {
        let found = match self.toks.get(self.pos) {
            None => "the end of the query".to_owned(),
            Some(t) => {
                let end = self
                    .toks
                    .get(self.pos + 1)
                    .map(|n| n.at)
                    .unwrap_or(self.text.len());
                format!("{:?}", self.text[t.at..end].trim())
            }
        };
        TraceQlError::at(self.at(), format!("expected {wanted}, found {found}"))
    }

    fn query(&mut self) -> Result<Query, TraceQlError> {
        let source = self.spanset_or()?;
        let mut stages = Vec::new();
        let mut metrics = None;
        while self.eat(&Tok::Pipe) {
            if metrics.is_some() {
                return Err(TraceQlError::at(
                    self.at(),
                    "a metrics function must be the last stage",
                ));
            }
            match self.stage()? {
                Ok(s) => stages.push(s),
                Err(m) => metrics = Some(m),
            }
        }
        Ok(Query {
            pipeline: Pipeline { source, stages },
            metrics,
            hints: Vec::new(),
        })
    }

    /// `with (name = value, …)` at the end of a query.
    fn hints(&mut self) -> Result<Vec<(String, Literal)>, TraceQlError> {
        match self.peek() {
            Some(Tok::Word(w)) if w == "with" => self.pos += 1,
            _ => return Ok(Vec::new()),
        }
        self.expect(Tok::LParen, "`(` after `with`")?;
        let mut hints = Vec::new();
        loop {
            let Some(Tok::Word(name)) = self.peek().cloned() else {
                return Err(self.unexpected("a hint name (`most_recent`)"));
            };
            self.pos += 1;
            self.expect(Tok::Eq, "`=` after the hint name")?;
            hints.push((name, self.literal()?));
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(Tok::RParen, "`)`")?;
        Ok(hints)
    }

    // spanset expressions: `||` binds loosest, then `&&`, then the structural operators
    fn spanset_or(&mut self) -> Result<Spanset, TraceQlError> {
        let mut left = self.spanset_and()?;
        while self.eat(&Tok::OrOr) {
            let right = self.spanset_and()?;
            left = Spanset::Binary(Box::new(left), SetOp::Or, Box::new(right));
        }
        Ok(left)
    }

    fn spanset_and(&mut self) -> Result<Spanset, TraceQlError> {
        let mut left = self.spanset_structural()?;
        while self.eat(&Tok::AndAnd) {
            let right = self.spanset_structural()?;
            left = Spanset::Binary(Box::new(left), SetOp::And, Box::new(right));
        }
        Ok(left)
    }

    fn spanset_structural(&mut self) -> Result<Spanset, TraceQlError> {
        let mut left = self.spanset_term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Gt) => SetOp::Child,
                Some(Tok::Desc) => SetOp::Descendant,
                Some(Tok::Lt) => SetOp::Parent,
                Some(Tok::Anc) => SetOp::Ancestor,
                Some(Tok::Tilde) => SetOp::Sibling,
                Some(Tok::Bang) => {
                    return Err(TraceQlError::at(
                        self.at(),
                        "negated structural operators (!>, !>>, !<, !<<, !~) are not supported",
                    ));
                }
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.spanset_term()?;
            left = Spanset::Binary(Box::new(left), op, Box::new(right));
        }
    }

    fn spanset_term(&mut self) -> Result<Spanset, TraceQlError> {
        match self.peek() {
            Some(Tok::LBrace) => {
                self.pos += 1;
                self.node()?;
                let expr = self.filter_body()?;
                Ok(Spanset::Filter(expr))
            }
            Some(Tok::LParen) => {
                self.pos += 1;
                self.enter()?;
                let q = self.query()?;
                self.depth -= 1;
                self.expect(Tok::RParen, "`)`")?;
                if q.metrics.is_some() {
                    return Err(TraceQlError::at(
                        self.at(),
                        "a metrics function cannot be used inside parentheses",
                    ));
                }
                Ok(if q.pipeline.stages.is_empty() {
                    q.pipeline.source
                } else {
                    Spanset::Pipeline(Box::new(q.pipeline))
                })
            }
            _ => Err(self.unexpected("a spanset (`{ … }`)")),
        }
    }

    /// After `{`: an optional field expression, then `}`.
    fn filter_body(&mut self) -> Result<Option<FieldExpr>, TraceQlError> {
        if self.eat(&Tok::RBrace) {
            return Ok(None);
        }
        let e = self.field_or()?;
        self.expect(Tok::RBrace, "`}`, `&&` or `||`")?;
        Ok(Some(e))
    }

    fn field_or(&mut self) -> Result<FieldExpr, TraceQlError> {
        let mut left = self.field_and()?;
        while self.eat(&Tok::OrOr) {
            let right = self.field_and()?;
            left = FieldExpr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn field_and(&mut self) -> Result<FieldExpr, TraceQlError> {
        let mut left = self.field_term()?;
        while self.eat(&Tok::AndAnd) {
            let right = self.field_term()?;
            left = FieldExpr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn field_term(&mut self) -> Result<FieldExpr, TraceQlError> {
        if self.eat(&Tok::Bang) {
            self.enter()?;
            let inner = self.field_term()?;
            self.depth -= 1;
            return Ok(FieldExpr::Not(Box::new(inner)));
        }
        if self.eat(&Tok::LParen) {
            self.enter()?;
            let e = self.field_or()?;
            self.depth -= 1;
            self.expect(Tok::RParen, "`)`")?;
            return Ok(e);
        }
        if let Some(Tok::Word(w)) = self.peek()
            && (w == "true" || w == "false")
            && !matches!(
                self.peek_at(1),
                Some(Tok::Eq | Tok::Ne | Tok::Lt | Tok::Le | Tok::Gt | Tok::Ge)
            )
        {
            let v = w == "true";
            self.pos += 1;
            return Ok(FieldExpr::Const(v));
        }
        let at = self.at();
        self.node()?;
        let field = self.field()?;
        let op = match self.peek() {
            Some(Tok::Eq) => CmpOp::Eq,
            Some(Tok::Ne) => CmpOp::Ne,
            Some(Tok::Re) => CmpOp::Re,
            Some(Tok::NotRe) => CmpOp::NotRe,
            Some(Tok::Lt) => CmpOp::Lt,
            Some(Tok::Le) => CmpOp::Le,
            Some(Tok::Gt) => CmpOp::Gt,
            Some(Tok::Ge) => CmpOp::Ge,
            _ => {
                return Err(self.unexpected(
                    "a comparison operator (=, !=, =~, !~, <, <=, >, >=) after the field",
                ));
            }
        };
        self.pos += 1;
        let value = self.literal()?;
        check_types(&field, op, &value).map_err(|m| TraceQlError::at(at, m))?;
        Ok(FieldExpr::Cmp(field, op, value))
    }

    fn field(&mut self) -> Result<Field, TraceQlError> {
        let at = self.at();
        let Some(Tok::Word(w)) = self.peek().cloned() else {
            return Err(self.unexpected(
                "a field (an intrinsic such as `duration`, or `span.x`, `resource.x`, `.x`)",
            ));
        };
        self.pos += 1;
        field_of(&w).map_err(|m| TraceQlError::at(at, m))
    }

    fn literal(&mut self) -> Result<Literal, TraceQlError> {
        let at = self.at();
        let Some(tok) = self.peek().cloned() else {
            return Err(self.unexpected("a value"));
        };
        self.pos += 1;
        Ok(match tok {
            Tok::Str(s) => Literal::Str(s),
            Tok::Duration(d) => Literal::Duration(d),
            Tok::Num(n) => {
                if let Ok(i) = n.parse::<i64>() {
                    Literal::Int(i)
                } else {
                    Literal::Float(
                        n.parse()
                            .map_err(|_| TraceQlError::at(at, format!("{n:?} is not a number")))?,
                    )
                }
            }
            Tok::Word(w) => match w.as_str() {
                "true" => Literal::Bool(true),
                "false" => Literal::Bool(false),
                "nil" => Literal::Nil,
                "error" => Literal::Status("ERROR"),
                "ok" => Literal::Status("OK"),
                "unset" => Literal::Status("UNSET"),
                "server" => Literal::Kind("SERVER"),
                "client" => Literal::Kind("CLIENT"),
                "producer" => Literal::Kind("PRODUCER"),
                "consumer" => Literal::Kind("CONSUMER"),
                "internal" | "unspecified" => Literal::Kind("INTERNAL"),
                other => {
                    return Err(TraceQlError::at(
                        at,
                        format!("{other:?} is not a value (strings are quoted: \"{other}\")"),
                    ));
                }
            },
            _ => {
                self.pos -= 1;
                return Err(self.unexpected("a value"));
            }
        })
    }

    fn number(&mut self) -> Result<f64, TraceQlError> {
        match self.literal()? {
            Literal::Int(i) => Ok(i as f64),
            Literal::Float(f) => Ok(f),
            Literal::Duration(d) => Ok(d as f64),
            _ => {
                self.pos -= 1;
                Err(self.unexpected("a number or a duration"))
            }
        }
    }

    fn fields(&mut self) -> Result<Vec<Field>, TraceQlError> {
        self.expect(Tok::LParen, "`(`")?;
        let mut out = vec![self.field()?];
        while self.eat(&Tok::Comma) {
            out.push(self.field()?);
        }
        self.expect(Tok::RParen, "`)`")?;
        Ok(out)
    }

    /// A stage after `|`: a pipeline stage, or (`Err`) a metrics function.
    fn stage(&mut self) -> Result<Result<Stage, MetricsStage>, TraceQlError> {
        self.node()?;
        if self.eat(&Tok::LBrace) {
            return Ok(Ok(Stage::Filter(self.filter_body()?)));
        }
        let at = self.at();
        let Some(Tok::Word(w)) = self.peek().cloned() else {
            return Err(self.unexpected("a pipeline stage"));
        };
        self.pos += 1;
        let stage = match w.as_str() {
            "count" => {
                self.expect(Tok::LParen, "`(`")?;
                self.expect(Tok::RParen, "`)`")?;
                self.aggregate_cmp(Aggregate::Count)?
            }
            "avg" | "min" | "max" | "sum" => {
                self.expect(Tok::LParen, "`(`")?;
                let f = self.field()?;
                self.expect(Tok::RParen, "`)`")?;
                let agg = match w.as_str() {
                    "avg" => Aggregate::Avg(f),
                    "min" => Aggregate::Min(f),
                    "max" => Aggregate::Max(f),
                    _ => Aggregate::Sum(f),
                };
                self.aggregate_cmp(agg)?
            }
            "by" => Stage::By(self.fields()?),
            "select" => Stage::Select(self.fields()?),
            "coalesce" => {
                self.expect(Tok::LParen, "`(`")?;
                self.expect(Tok::RParen, "`)`")?;
                Stage::Coalesce
            }
            "rate" | "count_over_time" => {
                self.expect(Tok::LParen, "`(`")?;
                self.expect(Tok::RParen, "`)`")?;
                let function = if w == "rate" {
                    MetricsFn::Rate
                } else {
                    MetricsFn::CountOverTime
                };
                return Ok(Err(self.metrics_by(function)?));
            }
            "avg_over_time"
            | "min_over_time"
            | "max_over_time"
            | "sum_over_time"
            | "histogram_over_time" => {
                self.expect(Tok::LParen, "`(`")?;
                let f = self.field()?;
                self.expect(Tok::RParen, "`)`")?;
                let function = match w.as_str() {
                    "avg_over_time" => MetricsFn::AvgOverTime(f),
                    "min_over_time" => MetricsFn::MinOverTime(f),
                    "max_over_time" => MetricsFn::MaxOverTime(f),
                    "sum_over_time" => MetricsFn::SumOverTime(f),
                    _ => MetricsFn::HistogramOverTime(f),
                };
                return Ok(Err(self.metrics_by(function)?));
            }
            "quantile_over_time" => {
                self.expect(Tok::LParen, "`(`")?;
                let f = self.field()?;
                let mut qs = Vec::new();
                while self.eat(&Tok::Comma) {
                    let q = self.number()?;
                    if !(0.0..=1.0).contains(&q) {
                        return Err(TraceQlError::at(
                            self.at(),
                            format!("quantile {q} is not between 0 and 1"),
                        ));
                    }
                    qs.push(q);
                }
                self.expect(Tok::RParen, "`)`")?;
                if qs.is_empty() {
                    return Err(TraceQlError::at(
                        at,
                        "quantile_over_time needs at least one quantile",
                    ));
                }
                return Ok(Err(self.metrics_by(MetricsFn::QuantileOverTime(f, qs))?));
            }
            other => {
                return Err(TraceQlError::at(
                    at,
                    format!(
                        "unsupported pipeline stage {other:?} (supported: {{ … }}, count(), avg(), min(), max(), sum(), by(), select(), coalesce(), rate(), count_over_time(), avg/min/max/sum_over_time(), quantile_over_time(), histogram_over_time())"
                    ),
                ));
            }
        };
        Ok(Ok(stage))
    }

    fn aggregate_cmp(&mut self, agg: Aggregate) -> Result<Stage, TraceQlError> {
        let op = match self.peek() {
            Some(Tok::Eq) => CmpOp::Eq,
            Some(Tok::Ne) => CmpOp::Ne,
            Some(Tok::Lt) => CmpOp::Lt,
            Some(Tok::Le) => CmpOp::Le,
            Some(Tok::Gt) => CmpOp::Gt,
            Some(Tok::Ge) => CmpOp::Ge,
            _ => return Err(self.unexpected("a comparison (`> 2`) after the aggregate")),
        };
        self.pos += 1;
        Ok(Stage::Aggregate(agg, op, self.number()?))
    }

    fn metrics_by(&mut self, function: MetricsFn) -> Result<MetricsStage, TraceQlError> {
        let by = match self.peek() {
            Some(Tok::Word(w)) if w == "by" => {
                self.pos += 1;
                self.fields()?
            }
            _ => Vec::new(),
        };
        Ok(MetricsStage { function, by })
    }
}

/// A field from its spelling (`span.x`, `resource.x`, `.x`, an intrinsic).
pub fn field_of(w: &str) -> Result<Field, String> {
    if let Some(i) = Intrinsic::by_name(w) {
        return Ok(Field::Intrinsic(i));
    }
    let attr = |scope, key: &str| {
        if key.is_empty() {
            Err(format!("{w:?} names no attribute"))
        } else {
            Ok(Field::Attr(scope, key.to_owned()))
        }
    };
    if let Some(k) = w.strip_prefix("span.") {
        return attr(Scope::Span, k);
    }
    if let Some(k) = w.strip_prefix("resource.") {
        return attr(Scope::Resource, k);
    }
    if let Some(k) = w.strip_prefix('.') {
        return attr(Scope::Any, k);
    }
    if w.contains(':') {
        return Err(format!(
            "unsupported intrinsic {w:?} (supported: {})",
            Intrinsic::ALL
                .iter()
                .map(|(i, _)| i.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for scope in ["instrumentation.", "event.", "link."] {
        if w.starts_with(scope) {
            return Err(format!(
                "the {} scope is not supported",
                &scope[..scope.len() - 1]
            ));
        }
    }
    Err(format!(
        "{w:?} is not a field (attributes are scoped: span.{w}, resource.{w} or .{w})"
    ))
}

/// Rejects comparisons that can never be true for the field's type.
fn check_types(field: &Field, op: CmpOp, value: &Literal) -> Result<(), String> {
    use Intrinsic::*;
    let regex = matches!(op, CmpOp::Re | CmpOp::NotRe);
    let ordered = matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge);
    if regex && !matches!(value, Literal::Str(_)) {
        return Err(format!("{op} needs a quoted regular expression"));
    }
    if regex
        && let Literal::Str(s) = value
        && let Err(e) = regex::Regex::new(s)
    {
        return Err(format!("bad regular expression {s:?}: {e}"));
    }
    let bad = || Err(format!("{field} cannot be compared with {value:?} by {op}"));
    match field {
        Field::Intrinsic(Status) => match value {
            Literal::Status(_) if !ordered => Ok(()),
            Literal::Nil => Ok(()),
            _ => bad(),
        },
        Field::Intrinsic(Kind) => match value {
            Literal::Kind(_) if !ordered => Ok(()),
            _ => bad(),
        },
        Field::Intrinsic(Duration | TraceDuration) => match value {
            Literal::Duration(_) | Literal::Int(_) | Literal::Float(_) if !regex => Ok(()),
            _ => bad(),
        },
        Field::Intrinsic(
            Name | StatusMessage | EventName | LinkTraceId | RootService | RootName | SpanId
            | TraceId,
        ) => match value {
            Literal::Str(_) | Literal::Nil => Ok(()),
            _ => bad(),
        },
        Field::Attr(..) => match value {
            Literal::Status(_) | Literal::Kind(_) => bad(),
            Literal::Bool(_) if ordered => bad(),
            _ => Ok(()),
        },
    }
}
