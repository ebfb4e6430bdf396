//! Result encodings of the HTTP SQL API: JSON (`{"columns": [...], "rows": [[...]]}`, int64 as
//! numbers, timestamps as RFC 3339 with nanoseconds), CSV (a header line, RFC 4180 quoting) and
//! Arrow IPC stream. Each encodes batch by batch, so results stream.

use std::fmt::Write as _;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::ipc::writer::StreamWriter;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use weft_query::sql::{SqlError, SqlErrorKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
    Arrow,
}

impl Format {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "json" => Ok(Self::Json),
            "csv" => Ok(Self::Csv),
            "arrow" => Ok(Self::Arrow),
            other => Err(format!(
                "unknown format {other:?}: use \"json\", \"csv\" or \"arrow\""
            )),
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Csv => "text/csv; charset=utf-8",
            Self::Arrow => "application/vnd.apache.arrow.stream",
        }
    }
}

pub struct Encoder {
    format: Format,
    schema: SchemaRef,
    rows_written: usize,
    arrow: Option<StreamWriter<Vec<u8>>>,
}

fn internal(e: impl std::fmt::Display) -> SqlError {
    SqlError {
        kind: SqlErrorKind::Internal,
        message: format!("cannot encode results: {e}"),
        line: None,
        column: None,
    }
}

/// A type's name as the JSON `columns` list gives it.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Int8 => "int8".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::UInt16 => "uint16".into(),
        DataType::UInt32 => "uint32".into(),
        DataType::UInt64 => "uint64".into(),
        DataType::Float16 | DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Timestamp(_, _) => "timestamp".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Null => "null".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            format!("list<{}>", type_name(f.data_type()))
        }
        DataType::Map(_, _) => "map<string,string>".into(),
        DataType::Dictionary(_, v) => type_name(v),
        other => other.to_string().to_ascii_lowercase(),
    }
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Nanoseconds since the epoch as RFC 3339 UTC with nine fraction digits.
pub fn rfc3339_nanos(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000) as u32;
    match chrono::DateTime::from_timestamp(secs, frac) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.9fZ").to_string(),
        None => nanos.to_string(),
    }
}

fn timestamp_nanos(a: &ArrayRef, unit: &TimeUnit, row: usize) -> i64 {
    use arrow::datatypes::*;
    match unit {
        TimeUnit::Second => a
            .as_primitive::<TimestampSecondType>()
            .value(row)
            .saturating_mul(1_000_000_000),
        TimeUnit::Millisecond => a
            .as_primitive::<TimestampMillisecondType>()
            .value(row)
            .saturating_mul(1_000_000),
        TimeUnit::Microsecond => a
            .as_primitive::<TimestampMicrosecondType>()
            .value(row)
            .saturating_mul(1_000),
        TimeUnit::Nanosecond => a.as_primitive::<TimestampNanosecondType>().value(row),
    }
}

/// One value as JSON text (maps and structs as objects, lists as arrays).
pub fn json_text(a: &ArrayRef, row: usize) -> String {
    let mut out = String::new();
    match ArrayFormatter::try_new(a.as_ref(), &FormatOptions::default()) {
        Ok(f) => json_value(&mut out, a, row, &f),
        Err(_) => out.push_str("null"),
    }
    out
}

/// One value as JSON.
fn json_value(out: &mut String, a: &ArrayRef, row: usize, fmt: &ArrayFormatter<'_>) {
    use arrow::datatypes::*;
    if a.is_null(row) {
        out.push_str("null");
        return;
    }
    match a.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => {
            let _ = write!(out, "{}", fmt.value(row));
        }
        DataType::Float32 | DataType::Float64 | DataType::Float16 => {
            let v = match a.data_type() {
                DataType::Float64 => a.as_primitive::<Float64Type>().value(row),
                DataType::Float32 => f64::from(a.as_primitive::<Float32Type>().value(row)),
                _ => f64::from(a.as_primitive::<Float16Type>().value(row)),
            };
            if v.is_finite() {
                let _ = write!(out, "{v}");
            } else {
                json_string(out, &v.to_string()); // NaN, inf: JSON has no such numbers
            }
        }
        DataType::Boolean => out.push_str(if a.as_boolean().value(row) {
            "true"
        } else {
            "false"
        }),
        DataType::Timestamp(unit, _) => {
            json_string(out, &rfc3339_nanos(timestamp_nanos(a, unit, row)))
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            let items = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value(row),
                DataType::LargeList(_) => a.as_list::<i64>().value(row),
                _ => a.as_fixed_size_list().value(row),
            };
            json_array(out, &items);
        }
        DataType::Map(_, _) => {
            let entries = a.as_map().value(row);
            let (keys, values) = (entries.column(0).clone(), entries.column(1).clone());
            let opts = FormatOptions::default();
            let kf = ArrayFormatter::try_new(keys.as_ref(), &opts);
            let vf = ArrayFormatter::try_new(values.as_ref(), &opts);
            out.push('{');
            if let (Ok(kf), Ok(vf)) = (kf, vf) {
                for i in 0..keys.len() {
                    if i > 0 {
                        out.push(',');
                    }
                    json_string(out, &kf.value(i).to_string());
                    out.push(':');
                    json_value(out, &values, i, &vf);
                }
            }
            out.push('}');
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            let opts = FormatOptions::default();
            out.push('{');
            for (i, (f, c)) in fields.iter().zip(s.columns()).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(out, f.name());
                out.push(':');
                match ArrayFormatter::try_new(c.as_ref(), &opts) {
                    Ok(cf) => json_value(out, c, row, &cf),
                    Err(_) => out.push_str("null"),
                }
            }
            out.push('}');
        }
        _ => json_string(out, &fmt.value(row).to_string()),
    }
}

fn json_array(out: &mut String, items: &ArrayRef) {
    let opts = FormatOptions::default();
    out.push('[');
    if let Ok(f) = ArrayFormatter::try_new(items.as_ref(), &opts) {
        for i in 0..items.len() {
            if i > 0 {
                out.push(',');
            }
            json_value(out, items, i, &f);
        }
    }
    out.push(']');
}

fn csv_field(out: &mut String, text: &str) {
    if text.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&text.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(text);
    }
}

impl Encoder {
    pub fn new(format: Format, schema: SchemaRef) -> Result<Self, SqlError> {
        let arrow = match format {
            Format::Arrow => Some(StreamWriter::try_new(Vec::new(), &schema).map_err(internal)?),
            _ => None,
        };
        Ok(Self {
            format,
            schema,
            rows_written: 0,
            arrow,
        })
    }

    /// What comes before the first row.
    pub fn begin(&mut self) -> Vec<u8> {
        match self.format {
            Format::Json => {
                let mut out = String::from("{\"columns\":[");
                for (i, f) in self.schema.fields().iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str("{\"name\":");
                    json_string(&mut out, f.name());
                    out.push_str(",\"type\":");
                    json_string(&mut out, &type_name(f.data_type()));
                    out.push('}');
                }
                out.push_str("],\"rows\":[");
                out.into_bytes()
            }
            Format::Csv => {
                let mut out = String::new();
                for (i, f) in self.schema.fields().iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    csv_field(&mut out, f.name());
                }
                out.push_str("\r\n");
                out.into_bytes()
            }
            Format::Arrow => self
                .arrow
                .as_mut()
                .map(|w| std::mem::take(w.get_mut()))
                .unwrap_or_default(),
        }
    }

    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, SqlError> {
        // Operators may hand out another physical type than the plan's schema announced
        // (Utf8View for Utf8, say): answers follow the announced schema.
        let conformed;
        let batch = if batch.schema().fields() == self.schema.fields() {
            batch
        } else {
            let columns = batch
                .columns()
                .iter()
                .zip(self.schema.fields())
                .map(|(c, f)| {
                    if c.data_type() == f.data_type() {
                        Ok(c.clone())
                    } else {
                        arrow::compute::cast(c, f.data_type())
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(internal)?;
            conformed = RecordBatch::try_new(self.schema.clone(), columns).map_err(internal)?;
            &conformed
        };
        if let Some(w) = &mut self.arrow {
            w.write(batch).map_err(internal)?;
            return Ok(std::mem::take(w.get_mut()));
        }
        let opts = FormatOptions::default().with_null("");
        let columns = batch.columns();
        let fmts = columns
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()
            .map_err(internal)?;
        let mut out = String::with_capacity(batch.num_rows() * 16 * columns.len().max(1));
        for row in 0..batch.num_rows() {
            match self.format {
                Format::Json => {
                    if self.rows_written > 0 {
                        out.push(',');
                    }
                    out.push('[');
                    for (i, (c, f)) in columns.iter().zip(&fmts).enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        json_value(&mut out, c, row, f);
                    }
                    out.push(']');
                }
                _ => {
                    for (i, (c, f)) in columns.iter().zip(&fmts).enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        if c.is_null(row) {
                            continue;
                        }
                        match c.data_type() {
                            DataType::Timestamp(unit, _) => {
                                out.push_str(&rfc3339_nanos(timestamp_nanos(c, unit, row)))
                            }
                            DataType::List(_)
                            | DataType::Map(_, _)
                            | DataType::Struct(_)
                            | DataType::LargeList(_) => {
                                let mut j = String::new();
                                json_value(&mut j, c, row, f);
                                csv_field(&mut out, &j);
                            }
                            _ => csv_field(&mut out, &f.value(row).to_string()),
                        }
                    }
                    out.push_str("\r\n");
                }
            }
            self.rows_written += 1;
        }
        Ok(out.into_bytes())
    }

    /// What comes after the last row; for JSON, an error met after rows were sent.
    /// The end of the answer: a JSON answer closes its rows, then names the `error` that
    /// cut it short and lists `warnings` (damaged blocks left out) when there are any.
    pub fn end(&mut self, error: Option<&serde_json::Value>, warnings: &[String]) -> Vec<u8> {
        match self.format {
            Format::Json => {
                let mut out = String::from("]");
                if let Some(e) = error {
                    out.push_str(&format!(",\"error\":{e}"));
                }
                if !warnings.is_empty() {
                    out.push_str(",\"warnings\":[");
                    for (i, w) in warnings.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        json_string(&mut out, w);
                    }
                    out.push(']');
                }
                out.push('}');
                out.into_bytes()
            }
            Format::Csv => Vec::new(),
            Format::Arrow => match &mut self.arrow {
                Some(w) => {
                    let _ = w.finish();
                    std::mem::take(w.get_mut())
                }
                None => Vec::new(),
            },
        }
    }
}
