//! `floor(log2(x))`, the latency bucket of every heatmap (`floor(log2(duration_ns / 1000.0))`),
//! read from the float's exponent instead of computed by libm.
//!
//! For a normal positive `x = m · 2^e` (`1 ≤ m < 2`), `log2(x) = e + log2(m)`, so the bucket is
//! `e`: the exponent field, no logarithm. The one trap is rounding: libm's `log2` is accurate
//! to within an ulp, and for `m` within an ulp's worth of 2 its result rounds up to `e + 1`
//! (`log2(1023.9999999999999)` is `10.0`). The exponent is therefore taken only when
//! `m < 2 - 2^-40`: there `log2(x) < e + 1 - 2^-41 / ln 2`, nearly three ulps of `e + 1` (an ulp
//! of a value under 1024 is at most 2^-42) below it, so no rounding within one ulp reaches it.
//! Every other value (such mantissas, zero, negatives, subnormals, infinities, NaN) is libm's
//! `floor(log2(x))`, so the answer is the same as DataFusion's to the bit.
//!
//! `floor` is replaced under its own name; its `simplify` turns `floor(log2(x))` over a
//! `Float64` into [`FloorLog2`], and answers every other call as DataFusion's `floor`.

use std::sync::{Arc, LazyLock};

use arrow::array::{AsArray, Float64Array};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::functions::math::floor::FloorFunc;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

/// DataFusion's `floor`, with `floor(log2(x))` simplified to [`FloorLog2`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FastFloor {
    inner: FloorFunc,
}

pub fn floor() -> ScalarUDF {
    ScalarUDF::from(FastFloor {
        inner: FloorFunc::new(),
    })
}

impl ScalarUDFImpl for FastFloor {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }
    fn is_strict(&self) -> bool {
        self.inner.is_strict()
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.inner.invoke_with_args(args)
    }
    fn output_ordering(&self, input: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(input)
    }
    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        if let [Expr::ScalarFunction(log2)] = args.as_slice()
            && log2.func.name() == "log2"
            && let [x] = log2.args.as_slice()
            && info.get_data_type(x)? == DataType::Float64
        {
            return Ok(ExprSimplifyResult::Simplified(Expr::ScalarFunction(
                ScalarFunction::new_udf(FLOOR_LOG2.clone(), vec![x.clone()]),
            )));
        }
        self.inner.simplify(args, info)
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

static FLOOR_LOG2: LazyLock<Arc<ScalarUDF>> =
    LazyLock::new(|| Arc::new(ScalarUDF::from(FloorLog2::new())));

/// `floor(log2(x))` over `Float64`, as one function (see the module comment).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FloorLog2 {
    signature: Signature,
}

impl FloorLog2 {
    fn new() -> Self {
        Self {
            signature: Signature::exact(vec![DataType::Float64], Volatility::Immutable),
        }
    }
}

/// Mantissa fractions at or above this (`m ≥ 2 - 2^-40`) are left to libm.
const NEAR_TWO: u64 = ((1u64 << 52) - 1) & !((1u64 << 12) - 1);

/// `floor(log2(x))`, as libm answers it (see the module comment).
pub fn floor_log2(x: f64) -> f64 {
    let bits = x.to_bits();
    let exponent = (bits >> 52) & 0x7ff;
    let fraction = bits & ((1u64 << 52) - 1);
    // positive (sign bit clear), normal (exponent neither 0 nor all ones), not near 2
    if bits >> 63 == 0 && exponent != 0 && exponent != 0x7ff && fraction < NEAR_TWO {
        return (exponent as i64 - 1023) as f64;
    }
    x.log2().floor()
}

impl ScalarUDFImpl for FloorLog2 {
    fn name(&self) -> &str {
        "floor_log2"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn is_strict(&self) -> bool {
        true
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(match &args.args[0] {
            ColumnarValue::Scalar(ScalarValue::Float64(v)) => {
                ColumnarValue::Scalar(ScalarValue::Float64(v.map(floor_log2)))
            }
            value => {
                let array = value.to_array(args.number_rows)?;
                let values: &Float64Array = array.as_primitive::<Float64Type>();
                ColumnarValue::Array(Arc::new(values.unary::<_, Float64Type>(floor_log2)))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn libm(x: f64) -> f64 {
        x.log2().floor()
    }

    fn same(x: f64) {
        let (a, b) = (floor_log2(x), libm(x));
        assert!(
            a == b || (a.is_nan() && b.is_nan()),
            "floor_log2({x:e}) = {a}, libm {b}"
        );
    }

    #[test]
    fn equals_libm_everywhere_it_is_asked() {
        // the edges: powers of two and their neighbours, the values whose log2 rounds up
        for e in -1074..1024 {
            let p = 2f64.powi(e);
            for x in [p, p.next_down(), p.next_up(), p * 1.5, p * 0.75] {
                same(x);
                same(-x);
            }
            let mut below = p;
            for _ in 0..4096 {
                below = below.next_down();
                same(below);
            }
        }
        for x in [
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
            f64::MIN_POSITIVE.next_down(),
            f64::MAX,
            1023.9999999999999,
        ] {
            same(x);
        }
        // the latencies heatmaps bucket: microseconds from nanoseconds, and random bits
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2_000_000 {
            same(rng.random_range(0i64..10_000_000_000) as f64 / 1000.0);
            same(f64::from_bits(rng.random::<u64>()));
        }
    }

    /// `floor(log2(…))` through SQL, with and without the replacement: the same rows and the
    /// same column names, and the plan says which function ran.
    #[tokio::test]
    async fn sql_answers_and_names_are_datafusion_s() {
        use arrow::array::{Float32Array, Int64Array, RecordBatch};
        use arrow::datatypes::{Field, Schema};
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionContext;

        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
            Field::new("f", DataType::Float32, true),
        ]));
        let mut xs: Vec<Option<f64>> = vec![
            None,
            Some(0.0),
            Some(-3.5),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(1024f64.next_down()),
            Some(5e-324),
        ];
        xs.extend((1..3000).map(|i| Some(i as f64 * 0.37)));
        let n = xs.len();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter(
                    (0..n as i64).map(|i| (i % 5 != 0).then_some(i * 104_729)),
                )),
                Arc::new(Float64Array::from(xs)),
                Arc::new(Float32Array::from_iter_values(
                    (0..n).map(|i| i as f32 * 0.3),
                )),
            ],
        )
        .unwrap();
        let table =
            || Arc::new(MemTable::try_new(schema.clone(), vec![vec![batch.clone()]]).unwrap());
        let queries = [
            "SELECT floor(log2(x)) FROM t",
            "SELECT CAST(floor(log2(d / 1000.0)) AS BIGINT) AS lat, count(*) FROM t GROUP BY 1",
            "SELECT floor(log2(d)), floor(log2(f)), floor(x) FROM t",
        ];
        for q in queries {
            let mut answers = Vec::new();
            for replaced in [false, true] {
                let ctx = SessionContext::new();
                if replaced {
                    ctx.register_udf(floor());
                }
                ctx.register_table("t", table()).unwrap();
                let df = ctx.sql(q).await.unwrap();
                let names: Vec<String> = df
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                let batches = df.collect().await.unwrap();
                let mut rows = crate::sql::tests::text_rows(&batches);
                rows.sort();
                let plan = ctx
                    .sql(&format!("EXPLAIN {q}"))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let plan = arrow::util::pretty::pretty_format_batches(&plan)
                    .unwrap()
                    .to_string();
                assert_eq!(replaced, plan.contains("floor_log2"), "{q}: {plan}");
                answers.push((names, rows));
            }
            assert_eq!(answers[0], answers[1], "{q}");
        }
    }

    #[test]
    fn a_rounding_trap_goes_to_libm() {
        // log2 of the float just under 1024 rounds to 10, and so must the bucket
        let x = 1024f64.next_down();
        assert_eq!(libm(x), 10.0);
        assert_eq!(floor_log2(x), 10.0);
    }
}
