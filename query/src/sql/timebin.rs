//! `date_bin` with a fast path for the form every time-series panel uses: a fixed stride
//! (seconds, minutes, hours, days) over a nanosecond timestamp column.
//!
//! DataFusion's `date_bin` calls a binning function through a pointer for every row, each with
//! a 64-bit division and three checked operations. A block keeps each trace's spans together
//! in start order, so consecutive rows mostly fall into the bucket of the row before: this path
//! keeps the current bucket's bounds and divides only when a row leaves it. The answer is the same as
//! DataFusion's (`origin + (t - origin) - (t - origin) mod⁺ stride`), and every other form
//! (months, a time-of-day argument, other units, a scalar, a batch near the ends of the
//! timestamp range, where DataFusion answers NULL or an error) is DataFusion's own.

use std::sync::Arc;

use arrow::array::{Array, AsArray, PrimitiveArray};
use arrow::datatypes::{
    DataType, IntervalDayTimeType, IntervalMonthDayNanoType, TimeUnit, TimestampNanosecondType,
};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::functions::datetime::date_bin::DateBinFunc;
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FastDateBin {
    inner: DateBinFunc,
}

pub fn date_bin() -> ScalarUDF {
    ScalarUDF::from(FastDateBin {
        inner: DateBinFunc::new(),
    })
}

const NANOS_PER_DAY: i64 = 86_400_000_000_000;

/// The stride in nanoseconds, where it is a fixed positive length.
fn stride_nanos(stride: &ColumnarValue) -> Option<i64> {
    let nanos = match stride {
        ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(v))) => {
            let (months, days, nanos) = IntervalMonthDayNanoType::to_parts(*v);
            if months != 0 {
                return None;
            }
            (days as i64)
                .checked_mul(NANOS_PER_DAY)?
                .checked_add(nanos)?
        }
        ColumnarValue::Scalar(ScalarValue::IntervalDayTime(Some(v))) => {
            let (days, ms) = IntervalDayTimeType::to_parts(*v);
            (days as i64)
                .checked_mul(NANOS_PER_DAY)?
                .checked_add((ms as i64).checked_mul(1_000_000)?)?
        }
        _ => return None,
    };
    (nanos > 0).then_some(nanos)
}

/// `values` binned, or `None` where some row's arithmetic would leave the i64 range (those
/// batches go to DataFusion, which answers NULL for such rows). Only a row that leaves the
/// current bucket does arithmetic, checked; the rest compare against its bounds.
fn bin(
    values: &PrimitiveArray<TimestampNanosecondType>,
    stride: i64,
    origin: i64,
) -> Option<PrimitiveArray<TimestampNanosecondType>> {
    if values.null_count() == values.len() {
        return None;
    }
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    let mut binned = Vec::with_capacity(values.len());
    // a row under a null slot holds any value: at worst it sends the batch to DataFusion
    for &t in values.values().iter() {
        if t < lo || t >= hi {
            let diff = t.checked_sub(origin)?;
            lo = origin.checked_add(diff.checked_sub(diff.rem_euclid(stride))?)?;
            hi = lo.checked_add(stride)?;
        }
        binned.push(lo);
    }
    Some(PrimitiveArray::new(binned.into(), values.nulls().cloned()))
}

impl ScalarUDFImpl for FastDateBin {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let fast = (|| {
            let stride = stride_nanos(args.args.first()?)?;
            let origin = match args.args.get(2) {
                None => 0,
                Some(ColumnarValue::Scalar(ScalarValue::TimestampNanosecond(Some(o), _))) => *o,
                Some(_) => return None,
            };
            let ColumnarValue::Array(array) = args.args.get(1)? else {
                return None;
            };
            let DataType::Timestamp(TimeUnit::Nanosecond, tz) = array.data_type() else {
                return None;
            };
            let binned = bin(
                array.as_primitive::<TimestampNanosecondType>(),
                stride,
                origin,
            )?;
            Some(ColumnarValue::Array(Arc::new(
                binned.with_timezone_opt(tz.clone()),
            )))
        })();
        match fast {
            Some(v) => Ok(v),
            None => self.inner.invoke_with_args(args),
        }
    }
    fn output_ordering(&self, input: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(input)
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::ArrayRef;
    use arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    fn call(
        f: &dyn ScalarUDFImpl,
        stride: ScalarValue,
        ts: ArrayRef,
        origin: Option<i64>,
    ) -> ArrayRef {
        let mut args = vec![
            ColumnarValue::Scalar(stride),
            ColumnarValue::Array(ts.clone()),
        ];
        if let Some(o) = origin {
            args.push(ColumnarValue::Scalar(ScalarValue::TimestampNanosecond(
                Some(o),
                None,
            )));
        }
        let arg_fields = args
            .iter()
            .map(|a| Arc::new(Field::new("a", a.data_type(), true)))
            .collect();
        let out = f
            .invoke_with_args(ScalarFunctionArgs {
                args,
                arg_fields,
                number_rows: ts.len(),
                return_field: Arc::new(Field::new("r", ts.data_type().clone(), true)),
                config_options: Arc::new(ConfigOptions::default()),
            })
            .unwrap();
        match out {
            ColumnarValue::Array(a) => a,
            ColumnarValue::Scalar(s) => s.to_array_of_size(ts.len()).unwrap(),
        }
    }

    #[test]
    fn same_as_datafusion() {
        let ours = FastDateBin {
            inner: DateBinFunc::new(),
        };
        let theirs = DateBinFunc::new();
        // in order, out of order, before the epoch, with nulls, with a time zone
        let mut seed = 11u64;
        let mut values: Vec<Option<i64>> = (0..5000)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let jitter = (seed % 5_000_000_000) as i64;
                if i % 97 == 0 {
                    None
                } else if i % 13 == 0 {
                    Some(-1_700_000_000_000_000_000 + jitter * 1000)
                } else {
                    Some(1_764_633_600_000_000_000 + i * 7_000_000_000 + jitter)
                }
            })
            .collect();
        values.push(Some(0));
        values.push(Some(-1));
        for tz in [None, Some("+02:00")] {
            let ts: ArrayRef = Arc::new(
                PrimitiveArray::<TimestampNanosecondType>::from(values.clone())
                    .with_timezone_opt(tz),
            );
            for stride in [
                ScalarValue::new_interval_mdn(0, 0, 1),
                ScalarValue::new_interval_mdn(0, 0, 10_000_000_000),
                ScalarValue::new_interval_mdn(0, 0, 60_000_000_000),
                ScalarValue::new_interval_mdn(0, 1, 0),
                ScalarValue::new_interval_dt(0, 15_000),
            ] {
                for origin in [
                    None,
                    Some(0),
                    Some(1_000_000_007),
                    Some(-86_399_999_999_999),
                ] {
                    let a = call(&ours, stride.clone(), ts.clone(), origin);
                    let b = call(&theirs, stride.clone(), ts.clone(), origin);
                    assert_eq!(
                        a.as_ref(),
                        b.as_ref(),
                        "stride {stride:?} origin {origin:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ends_of_the_range_are_datafusions() {
        let ours = FastDateBin {
            inner: DateBinFunc::new(),
        };
        let theirs = DateBinFunc::new();
        let ts: ArrayRef = Arc::new(PrimitiveArray::<TimestampNanosecondType>::from(vec![
            Some(i64::MIN + 5),
            Some(i64::MAX - 5),
            Some(0),
        ]));
        let stride = ScalarValue::new_interval_mdn(0, 0, 60_000_000_000);
        let a = call(&ours, stride.clone(), ts.clone(), Some(1));
        let b = call(&theirs, stride, ts, Some(1));
        assert_eq!(a.as_ref(), b.as_ref());
    }
}
