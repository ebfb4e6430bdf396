//! TraceQL field expressions as SQL predicates over the `spans` table (alias `s`, joined to
//! `traces` as `t` when a trace-level intrinsic is asked for), so that a spanset filter selects
//! its rows exactly as SQL does: time bounds, postings and block pruning pushed down, no trace
//! materialised first.

use weft_storage::schema::{ColumnType, DEDICATED, dedicated_for};

use super::ast::*;
use crate::analytics::params::{ident, lit};

/// How a field reads in SQL and what type its values have there.
pub struct Column {
    pub sql: String,
    pub ty: ColumnType,
}

/// The SQL expression of a field's value (`None` for the fields only comparisons can read:
/// `event:name`, `link:traceID`).
pub fn column(field: &Field) -> Option<Column> {
    use Intrinsic::*;
    let c = |sql: &str, ty| {
        Some(Column {
            sql: sql.to_owned(),
            ty,
        })
    };
    match field {
        Field::Intrinsic(i) => match i {
            Name => c("s.name", ColumnType::Str),
            Status => c("s.status_code", ColumnType::Str),
            StatusMessage => c("s.status_message", ColumnType::Str),
            Kind => c("s.kind", ColumnType::Str),
            Duration => c("s.duration_ns", ColumnType::Int),
            SpanId => c("s.span_id", ColumnType::Str),
            TraceId => c("s.trace_id", ColumnType::Str),
            TraceDuration => c("t.duration_ns", ColumnType::Int),
            RootService => c("t.root_service", ColumnType::Str),
            RootName => c("t.root_name", ColumnType::Str),
            EventName | LinkTraceId => None,
        },
        Field::Attr(scope, key) => {
            let span = || match dedicated_for(key) {
                Some((i, _)) => Column {
                    sql: format!("s.{}", ident(DEDICATED[i].name)),
                    ty: DEDICATED[i].ty,
                },
                None => Column {
                    sql: format!("s.attributes[{}]", lit(key)),
                    ty: ColumnType::Str,
                },
            };
            let resource = || {
                if key == "service.name" {
                    Column {
                        sql: "s.service_name".into(),
                        ty: ColumnType::Str,
                    }
                } else {
                    Column {
                        sql: format!("s.resource_attributes[{}]", lit(key)),
                        ty: ColumnType::Str,
                    }
                }
            };
            Some(match scope {
                Scope::Span => span(),
                Scope::Resource => resource(),
                Scope::Any => {
                    if key == "service.name" {
                        resource()
                    } else {
                        let s = span();
                        if dedicated_for(key).is_some() {
                            s
                        } else {
                            Column {
                                sql: format!("coalesce({}, {})", s.sql, resource().sql),
                                ty: ColumnType::Str,
                            }
                        }
                    }
                }
            })
        }
    }
}

/// Whether an expression reads a trace-level intrinsic (so needs the `traces` join).
pub fn needs_traces(e: &FieldExpr) -> bool {
    match e {
        FieldExpr::Cmp(Field::Intrinsic(i), ..) => i.is_trace_level(),
        FieldExpr::Cmp(..) | FieldExpr::Const(_) => false,
        FieldExpr::And(a, b) | FieldExpr::Or(a, b) => needs_traces(a) || needs_traces(b),
        FieldExpr::Not(a) => needs_traces(a),
    }
}

/// The SQL predicate of a field expression.
pub fn predicate(e: &FieldExpr) -> String {
    match e {
        FieldExpr::Const(true) => "TRUE".into(),
        FieldExpr::Const(false) => "FALSE".into(),
        FieldExpr::And(a, b) => format!("({} AND {})", predicate(a), predicate(b)),
        FieldExpr::Or(a, b) => format!("({} OR {})", predicate(a), predicate(b)),
        // TraceQL's negation holds where the inner comparison is false or has no value
        FieldExpr::Not(a) => format!("(({}) IS NOT TRUE)", predicate(a)),
        FieldExpr::Cmp(field, op, value) => comparison(field, *op, value),
    }
}

fn comparison(field: &Field, op: CmpOp, value: &Literal) -> String {
    match field {
        Field::Intrinsic(Intrinsic::EventName) => {
            return related("span_events", "name", op, value);
        }
        Field::Intrinsic(Intrinsic::LinkTraceId) => {
            return related("span_links", "linked_trace_id", op, value);
        }
        _ => {}
    }
    let col = column(field).expect("every other field has a column");
    if let Literal::Nil = value {
        return match op {
            CmpOp::Eq => format!("{} IS NULL", col.sql),
            _ => format!("{} IS NOT NULL", col.sql),
        };
    }
    let sql = &col.sql;
    match (value, col.ty) {
        (Literal::Str(s), _) => match op {
            CmpOp::Re => format!("{sql} ~ {}", lit(&anchored(s))),
            CmpOp::NotRe => format!("{sql} !~ {}", lit(&anchored(s))),
            _ if matches!(field, Field::Intrinsic(Intrinsic::TraceId)) => {
                format!("{sql} {} {}", op.sql(), lit(&pad_id(s)))
            }
            _ => match col.ty {
                ColumnType::Str => format!("{sql} {} {}", op.sql(), lit(s)),
                _ => format!("CAST({sql} AS VARCHAR) {} {}", op.sql(), lit(s)),
            },
        },
        (Literal::Status(s) | Literal::Kind(s), _) => {
            format!("{sql} {} {}", op.sql(), lit(s))
        }
        (Literal::Bool(b), ColumnType::Bool) => format!("{sql} {} {b}", op.sql()),
        (Literal::Bool(b), _) => format!("CAST({sql} AS VARCHAR) {} '{b}'", op.sql()),
        (Literal::Int(_) | Literal::Float(_) | Literal::Duration(_), ty) => {
            let n = value.number().expect("numeric literal");
            let n = if n.fract() == 0.0 && n.abs() < 9e15 {
                format!("{}", n as i64)
            } else {
                format!("{n:?}")
            };
            match ty {
                ColumnType::Int | ColumnType::Double => format!("{sql} {} {n}", op.sql()),
                _ => format!("try_cast({sql} AS DOUBLE) {} {n}", op.sql()),
            }
        }
        (Literal::Nil, _) => unreachable!("handled above"),
    }
}

/// A comparison on a span's events or links: the span has one that matches.
fn related(table: &str, column: &str, op: CmpOp, value: &Literal) -> String {
    let cond = match value {
        Literal::Nil => {
            let exists = format!(
                "concat(s.trace_id, s.span_id) IN (SELECT concat(trace_id, span_id) FROM {table})"
            );
            return if op == CmpOp::Eq {
                format!("NOT ({exists})")
            } else {
                exists
            };
        }
        Literal::Str(s) => match op {
            CmpOp::Re => format!("{column} ~ {}", lit(&anchored(s))),
            CmpOp::NotRe => format!("{column} !~ {}", lit(&anchored(s))),
            _ if column == "linked_trace_id" => {
                format!("{column} {} {}", op.sql(), lit(&pad_id(s)))
            }
            _ => format!("{column} {} {}", op.sql(), lit(s)),
        },
        _ => unreachable!("checked by the parser"),
    };
    format!(
        "concat(s.trace_id, s.span_id) IN (SELECT concat(trace_id, span_id) FROM {table} WHERE {cond})"
    )
}

/// TraceQL regular expressions match the whole value.
fn anchored(re: &str) -> String {
    format!("^(?:{re})$")
}

/// A trace id as stored: 32 lower-case hex digits, left-padded.
pub fn pad_id(s: &str) -> String {
    let s = s.to_ascii_lowercase();
    if s.len() < 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{s:0>32}")
    } else {
        s
    }
}
