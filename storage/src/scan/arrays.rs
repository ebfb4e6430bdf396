//! Arrow arrays every signal's columns are built with: the SQL types of stored values, ids as
//! hex text, attribute maps, and attribute values as typed columns.

use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, BooleanBuilder, FixedSizeBinaryArray, Float64Builder, Int64Builder,
    ListBuilder, MapBuilder, StringArray, StringBuilder, StringViewBuilder,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, TimeUnit};

use crate::error::Result;
use crate::model::{KeyValue, Value};
use crate::schema::ColumnType;

pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

pub fn map_type() -> DataType {
    static TYPE: OnceLock<DataType> = OnceLock::new();
    TYPE.get_or_init(|| {
        MapBuilder::new(None, StringBuilder::new(), StringBuilder::new())
            .finish()
            .data_type()
            .clone()
    })
    .clone()
}

pub fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

pub fn sql_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::Str => DataType::Utf8,
        ColumnType::Int => DataType::Int64,
        ColumnType::Double => DataType::Float64,
        ColumnType::Bool => DataType::Boolean,
        ColumnType::StrList => list_type(),
    }
}

/// Lower-case hex of every byte value, two characters each.
pub(crate) const HEX_PAIRS: [[u8; 2]; 256] = {
    let digits = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [digits[i >> 4], digits[i & 15]];
        i += 1;
    }
    t
};

/// Ids as lower-case hex strings, written straight into one values buffer (every value has the
/// same width, so the offsets are arithmetic); null ids stay null.
pub fn hex_column(a: &FixedSizeBinaryArray) -> ArrayRef {
    let width = a.value_length() as usize;
    let raw = a.value_data();
    let mut values = Vec::with_capacity(raw.len() * 2);
    for byte in raw {
        values.extend_from_slice(&HEX_PAIRS[*byte as usize]);
    }
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(width * 2, a.len()));
    let nulls = a.nulls().cloned();
    // hex digits are ASCII: the UTF-8 check (the crate forbids skipping it) cannot fail
    Arc::new(StringArray::new(offsets, values.into(), nulls))
}

pub fn map_column<'a>(rows: impl Iterator<Item = &'a [KeyValue]>) -> Result<ArrayRef> {
    let mut b = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for kvs in rows {
        for kv in kvs {
            b.keys().append_value(&kv.key);
            b.values().append_option(kv.value.text());
        }
        b.append(true)?;
    }
    Ok(Arc::new(b.finish()))
}

/// Builds a column of `ty` from attribute values; values of another type are converted where
/// that is lossless in meaning (an int as a float, anything as text) and NULL otherwise.
pub fn values_column(ty: &DataType, values: impl Iterator<Item = Option<Value>>) -> ArrayRef {
    match ty {
        DataType::Int64 => {
            let mut b = Int64Builder::new();
            values.for_each(|v| {
                b.append_option(if let Some(Value::Int(i)) = v {
                    Some(i)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::new();
            values.for_each(|v| {
                b.append_option(match v {
                    Some(Value::Double(d)) => Some(d),
                    Some(Value::Int(i)) => Some(i as f64),
                    _ => None,
                })
            });
            Arc::new(b.finish())
        }
        DataType::Boolean => {
            let mut b = BooleanBuilder::new();
            values.for_each(|v| {
                b.append_option(if let Some(Value::Bool(x)) = v {
                    Some(x)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        DataType::List(_) => {
            let mut b = ListBuilder::new(StringBuilder::new());
            for v in values {
                match v {
                    Some(Value::Array(items)) => {
                        for item in items {
                            b.values().append_option(item.text());
                        }
                        b.append(true);
                    }
                    _ => b.append(false),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Utf8View => {
            let mut b = StringViewBuilder::new();
            values.for_each(|v| b.append_option(v.as_ref().and_then(Value::text)));
            Arc::new(b.finish())
        }
        _ => {
            let mut b = StringBuilder::new();
            values.for_each(|v| b.append_option(v.as_ref().and_then(Value::text)));
            Arc::new(b.finish())
        }
    }
}

/// The values of a typed column (as the model's values), for merging with other sources.
pub fn typed_values(a: &ArrayRef) -> Vec<Option<Value>> {
    use arrow::array::AsArray;
    (0..a.len())
        .map(|i| {
            if a.is_null(i) {
                return None;
            }
            Some(match a.data_type() {
                DataType::Int64 => {
                    Value::Int(a.as_primitive::<arrow::datatypes::Int64Type>().value(i))
                }
                DataType::Float64 => {
                    Value::Double(a.as_primitive::<arrow::datatypes::Float64Type>().value(i))
                }
                DataType::Boolean => Value::Bool(a.as_boolean().value(i)),
                DataType::Utf8 => Value::Str(a.as_string::<i32>().value(i).to_owned()),
                DataType::Utf8View => Value::Str(a.as_string_view().value(i).to_owned()),
                DataType::List(_) => {
                    let l = a.as_list::<i32>().value(i);
                    Value::Array(
                        l.as_string::<i32>()
                            .iter()
                            .map(|s| Value::Str(s.unwrap_or_default().to_owned()))
                            .collect(),
                    )
                }
                _ => return None,
            })
        })
        .collect()
}
