//! What a TraceQL query says, as the parser reads it.

use std::fmt;

/// A whole query: a spanset expression, then pipeline stages.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    pub pipeline: Pipeline,
    /// A metrics function closing the pipeline (`| rate() by (resource.service.name)`).
    pub metrics: Option<MetricsStage>,
    /// Query hints (`with (most_recent=true)`). Answers are always newest first and exact, so
    /// `most_recent` holds whatever its value; other hints are read and, as Tempo does with
    /// hints it does not know, ignored.
    pub hints: Vec<(String, Literal)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    pub source: Spanset,
    pub stages: Vec<Stage>,
}

/// An expression over spansets: a filter, or two spansets combined.
#[derive(Clone, Debug, PartialEq)]
pub enum Spanset {
    /// `{ expr }`; `{ }` (`None`) matches every span.
    Filter(Option<FieldExpr>),
    Binary(Box<Spanset>, SetOp, Box<Spanset>),
    /// A parenthesised pipeline used as a spanset (`({ } | count() > 2) && { }`).
    Pipeline(Box<Pipeline>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOp {
    /// `&&`: traces with a span on each side; the spans of both.
    And,
    /// `||`: the spans of either side.
    Or,
    /// `>`: right-hand spans whose parent matches the left.
    Child,
    /// `>>`: right-hand spans with an ancestor matching the left.
    Descendant,
    /// `<`: right-hand spans that are the parent of a left-hand span.
    Parent,
    /// `<<`: right-hand spans that are an ancestor of a left-hand span.
    Ancestor,
    /// `~`: right-hand spans with a sibling matching the left.
    Sibling,
}

/// A boolean expression over one span's fields.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldExpr {
    Cmp(Field, CmpOp, Literal),
    And(Box<FieldExpr>, Box<FieldExpr>),
    Or(Box<FieldExpr>, Box<FieldExpr>),
    Not(Box<FieldExpr>),
    /// `{ true }`, `{ false }`.
    Const(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Re,
    NotRe,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn sql(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Re => "~",
            CmpOp::NotRe => "!~",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Re | CmpOp::NotRe => false,
        }
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "!=",
            CmpOp::Re => "=~",
            CmpOp::NotRe => "!~",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        })
    }
}

/// What a comparison reads from a span.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Intrinsic(Intrinsic),
    Attr(Scope, String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Span,
    Resource,
    /// `.key`: the span's attribute, else the resource's.
    Any,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Intrinsic {
    Name,
    Status,
    StatusMessage,
    Kind,
    Duration,
    EventName,
    LinkTraceId,
    TraceDuration,
    RootService,
    RootName,
    SpanId,
    TraceId,
}

impl Intrinsic {
    /// Every intrinsic by its TraceQL names (the scoped spelling first).
    pub const ALL: &'static [(Intrinsic, &'static [&'static str])] = &[
        (Intrinsic::Name, &["span:name", "name"]),
        (Intrinsic::Status, &["span:status", "status"]),
        (
            Intrinsic::StatusMessage,
            &["span:statusMessage", "statusMessage"],
        ),
        (Intrinsic::Kind, &["span:kind", "kind"]),
        (Intrinsic::Duration, &["span:duration", "duration"]),
        (Intrinsic::EventName, &["event:name"]),
        (Intrinsic::LinkTraceId, &["link:traceID"]),
        (
            Intrinsic::TraceDuration,
            &["trace:duration", "traceDuration"],
        ),
        (
            Intrinsic::RootService,
            &["trace:rootService", "rootServiceName"],
        ),
        (Intrinsic::RootName, &["trace:rootName", "rootName"]),
        (Intrinsic::SpanId, &["span:id"]),
        (Intrinsic::TraceId, &["trace:id"]),
    ];

    pub fn by_name(name: &str) -> Option<Intrinsic> {
        Self::ALL
            .iter()
            .find(|(_, names)| names.contains(&name))
            .map(|(i, _)| *i)
    }

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(i, _)| *i == self).unwrap().1[0]
    }

    /// The name Tempo lists it under in the `intrinsic` tag scope.
    pub fn tag_name(self) -> &'static str {
        let names = Self::ALL.iter().find(|(i, _)| *i == self).unwrap().1;
        names.last().copied().unwrap_or(names[0])
    }

    /// Whether the value is the trace's, not the span's.
    pub fn is_trace_level(self) -> bool {
        matches!(
            self,
            Intrinsic::TraceDuration | Intrinsic::RootService | Intrinsic::RootName
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Intrinsic(i) => f.write_str(i.name()),
            Field::Attr(Scope::Span, k) => write!(f, "span.{k}"),
            Field::Attr(Scope::Resource, k) => write!(f, "resource.{k}"),
            Field::Attr(Scope::Any, k) => write!(f, ".{k}"),
        }
    }
}

/// A typed TraceQL value.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Str(String),
    Int(i64),
    Float(f64),
    /// Nanoseconds.
    Duration(u64),
    Bool(bool),
    /// `error`, `ok`, `unset`: the stored status code.
    Status(&'static str),
    /// `server`, `client`, …: the stored span kind.
    Kind(&'static str),
    Nil,
}

impl Literal {
    /// The value as a number, when it is one (durations in nanoseconds).
    pub fn number(&self) -> Option<f64> {
        match self {
            Literal::Int(i) => Some(*i as f64),
            Literal::Float(f) => Some(*f),
            Literal::Duration(d) => Some(*d as f64),
            _ => None,
        }
    }
}

/// One stage after `|`.
#[derive(Clone, Debug, PartialEq)]
pub enum Stage {
    /// `| { expr }`: keeps the spans of each spanset that match.
    Filter(Option<FieldExpr>),
    /// `| count() > 2`, `| avg(duration) > 1s`: keeps spansets whose aggregate holds.
    Aggregate(Aggregate, CmpOp, f64),
    /// `| by(resource.service.name)`: splits each spanset by the field's value.
    By(Vec<Field>),
    /// `| select(span.http.status_code)`: adds fields to the returned spans.
    Select(Vec<Field>),
    /// `| coalesce()`: merges a trace's spansets into one.
    Coalesce,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Aggregate {
    Count,
    Avg(Field),
    Min(Field),
    Max(Field),
    Sum(Field),
}

/// A TraceQL metrics function.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsStage {
    pub function: MetricsFn,
    pub by: Vec<Field>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MetricsFn {
    Rate,
    CountOverTime,
    AvgOverTime(Field),
    MinOverTime(Field),
    MaxOverTime(Field),
    SumOverTime(Field),
    QuantileOverTime(Field, Vec<f64>),
    HistogramOverTime(Field),
}
