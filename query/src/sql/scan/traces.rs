//! Trace ids that a parent's dynamic filter restricts a scan's rows to: a join whose build
//! side holds a few trace ids (DataFusion pushes them as `trace_id IN (…)`, per partition of
//! a partitioned join under a `CASE`, or as equal bounds) lets the scan read only those
//! traces' rows, found through the trace-id index, instead of every row of every block.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CaseExpr, Column, InListExpr, Literal};
use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;

/// Most trace ids the scan looks up in the index for one filter.
pub const MAX_TRACE_IDS: usize = 4096;

/// The trace ids every row passing all `filters` has, when one of them says (a superset is
/// fine: the filters stay enforced by their owners).
pub fn filtered_trace_ids(filters: &[Arc<dyn PhysicalExpr>]) -> Option<BTreeSet<String>> {
    filters
        .iter()
        .filter_map(|f| snapshot_physical_expr(f.clone()).ok())
        .filter_map(|e| ids_of(&e))
        .reduce(|a, b| a.intersection(&b).cloned().collect())
        .filter(|ids| ids.len() <= MAX_TRACE_IDS)
}

fn is_trace_id(e: &Arc<dyn PhysicalExpr>) -> bool {
    e.downcast_ref::<Column>()
        .is_some_and(|c| c.name() == "trace_id")
}

fn text(e: &Arc<dyn PhysicalExpr>) -> Option<String> {
    match e.downcast_ref::<Literal>()?.value() {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
        | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

/// `trace_id <op> 'literal'` (either way round) as (op, literal).
fn compared(e: &Arc<dyn PhysicalExpr>) -> Option<(Operator, String)> {
    let b = e.downcast_ref::<BinaryExpr>()?;
    if is_trace_id(b.left()) {
        Some((*b.op(), text(b.right())?))
    } else if is_trace_id(b.right()) {
        Some((b.op().swap()?, text(b.left())?))
    } else {
        None
    }
}

fn ids_of(e: &Arc<dyn PhysicalExpr>) -> Option<BTreeSet<String>> {
    let any = e;
    if let Some(l) = any.downcast_ref::<Literal>() {
        // a partition with an empty build side
        return matches!(l.value(), ScalarValue::Boolean(Some(false))).then(BTreeSet::new);
    }
    if let Some(list) = any.downcast_ref::<InListExpr>() {
        if list.negated() || !is_trace_id(list.expr()) || list.len() > MAX_TRACE_IDS {
            return None;
        }
        return list.list().iter().map(text).collect();
    }
    if let Some(case) = any.downcast_ref::<CaseExpr>() {
        // one branch per partition of a partitioned join: a row passes one of them
        let mut all = BTreeSet::new();
        for (_, then) in case.when_then_expr() {
            all.extend(ids_of(then)?);
        }
        if let Some(other) = case.else_expr() {
            all.extend(ids_of(other)?);
        }
        return Some(all);
    }
    let b = any.downcast_ref::<BinaryExpr>()?;
    match b.op() {
        Operator::Eq => compared(e).map(|(_, v)| BTreeSet::from([v])),
        Operator::Or => {
            let mut a = ids_of(b.left())?;
            a.extend(ids_of(b.right())?);
            Some(a)
        }
        Operator::And => {
            // equal bounds (`trace_id >= x AND trace_id <= x`) are one id
            if let (Some((Operator::GtEq, lo)), Some((Operator::LtEq, hi))) =
                (compared(b.left()), compared(b.right()))
                && lo == hi
            {
                return Some(BTreeSet::from([lo]));
            }
            match (ids_of(b.left()), ids_of(b.right())) {
                (Some(l), Some(r)) => Some(l.intersection(&r).cloned().collect()),
                (l, r) => l.or(r),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::{col, lit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("trace_id", DataType::Utf8, false),
            Field::new("name", DataType::Utf8, false),
        ])
    }

    fn and(a: Arc<dyn PhysicalExpr>, b: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(a, Operator::And, b))
    }

    fn cmp(op: Operator, v: &str) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(
            col("trace_id", &schema()).unwrap(),
            op,
            lit(v),
        ))
    }

    #[test]
    fn in_lists_and_equal_bounds_name_trace_ids() {
        let s = schema();
        let list = Arc::new(
            InListExpr::try_new_from_array(
                col("trace_id", &s).unwrap(),
                Arc::new(StringArray::from(vec!["b", "a"])),
                false,
                &s,
            )
            .unwrap(),
        );
        let bounded = and(
            and(cmp(Operator::GtEq, "a"), cmp(Operator::LtEq, "b")),
            list,
        );
        assert_eq!(
            filtered_trace_ids(&[bounded]),
            Some(BTreeSet::from(["a".to_owned(), "b".to_owned()]))
        );
        let one = and(cmp(Operator::GtEq, "c"), cmp(Operator::LtEq, "c"));
        assert_eq!(
            filtered_trace_ids(&[one]),
            Some(BTreeSet::from(["c".to_owned()]))
        );
        // a range or another column says nothing
        let range = and(cmp(Operator::GtEq, "a"), cmp(Operator::LtEq, "b"));
        assert_eq!(filtered_trace_ids(&[range]), None);
        let other: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            col("name", &s).unwrap(),
            Operator::Eq,
            lit("x"),
        ));
        assert_eq!(filtered_trace_ids(&[other]), None);
        assert_eq!(filtered_trace_ids(&[lit(true)]), None);
        assert_eq!(filtered_trace_ids(&[lit(false)]), Some(BTreeSet::new()));
    }
}
