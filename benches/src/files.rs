//! Files the generator writes: OTLP request files (for replay by `weft-bench send`) and a flat
//! Parquet file of the same spans (for loading into peers such as DuckDB and chDB).
//!
//! OTLP request file layout: the magic line `WEFT-OTLP-TRACES 1\n`, then per message a
//! little-endian u32 length and that many bytes of protobuf `ExportTraceServiceRequest`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Builder, Int64Builder, RecordBatch, StringBuilder, TimestampNanosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use prost::Message;

const MAGIC: &[u8] = b"WEFT-OTLP-TRACES 1\n";

pub fn write_otlp(
    path: &Path,
    messages: impl Iterator<Item = ExportTraceServiceRequest>,
) -> anyhow::Result<usize> {
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(MAGIC)?;
    let mut n = 0;
    for m in messages {
        let bytes = m.encode_to_vec();
        out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        out.write_all(&bytes)?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}

pub fn read_otlp(path: &Path) -> anyhow::Result<Vec<bytes::Bytes>> {
    let mut input = BufReader::new(File::open(path)?);
    let mut magic = vec![0u8; MAGIC.len()];
    input.read_exact(&mut magic)?;
    anyhow::ensure!(
        magic == MAGIC,
        "{} is not a weft-bench OTLP file",
        path.display()
    );
    let mut out = Vec::new();
    let mut len = [0u8; 4];
    loop {
        match input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(e) => return Err(e.into()),
        }
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        input.read_exact(&mut buf)?;
        out.push(buf.into());
    }
}

const STR_COLUMNS: [&str; 11] = [
    "llm.model_version",
    "llm.lora_adapter",
    "llm.kv_cache_strategy",
    "worker.id",
    "gpu.id",
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "tenant.id",
    "http.route",
    "gen_ai.conversation.id",
];
const INT_COLUMNS: [&str; 4] = [
    "llm.batch_size",
    "llm.token.index",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
];
const F64_COLUMNS: [&str; 2] = ["llm.token.latency_ms", "gen_ai.latency.time_to_first_token"];
/// Old GenAI names, written under the new ones as Weft's alias table does.
const ALIASES: [(&str, &str); 3] = [
    ("gen_ai.system", "gen_ai.provider.name"),
    ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"),
    (
        "gen_ai.usage.completion_tokens",
        "gen_ai.usage.output_tokens",
    ),
];

fn schema() -> Arc<Schema> {
    let ts = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
    let mut fields = vec![
        Field::new("trace_id", DataType::Utf8, false),
        Field::new("span_id", DataType::Utf8, false),
        Field::new("parent_span_id", DataType::Utf8, true),
        Field::new("service_name", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("status_code", DataType::Utf8, false),
        Field::new("start_time", ts.clone(), false),
        Field::new("end_time", ts, false),
        Field::new("duration_ns", DataType::Int64, false),
    ];
    fields.extend(
        STR_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, true)),
    );
    fields.extend(
        INT_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Int64, true)),
    );
    fields.extend(
        F64_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Float64, true)),
    );
    Arc::new(Schema::new(fields))
}

// As Weft's SQL shows them: OTLP lets receivers read UNSPECIFIED as INTERNAL.
const KINDS: [&str; 6] = [
    "INTERNAL", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER",
];
const STATUS: [&str; 3] = ["UNSET", "OK", "ERROR"];

/// A resource's `service.name` (`unknown_service` without one, as Weft names it).
fn service_name(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> &str {
    resource
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
        .unwrap_or("unknown_service")
}

/// Writes the spans of `messages` as one flat Parquet file (the peers' copy of the data).
pub fn write_parquet(
    path: &Path,
    messages: impl Iterator<Item = ExportTraceServiceRequest>,
) -> anyhow::Result<usize> {
    let schema = schema();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(path)?, schema.clone(), Some(props))?;
    let mut rows = 0;
    for m in messages {
        let mut strs: Vec<StringBuilder> = (0..7 + STR_COLUMNS.len())
            .map(|_| StringBuilder::new())
            .collect();
        let mut times: Vec<TimestampNanosecondBuilder> = (0..2)
            .map(|_| TimestampNanosecondBuilder::new().with_timezone("UTC"))
            .collect();
        let mut ints: Vec<Int64Builder> = (0..1 + INT_COLUMNS.len())
            .map(|_| Int64Builder::new())
            .collect();
        let mut floats: Vec<Float64Builder> = (0..F64_COLUMNS.len())
            .map(|_| Float64Builder::new())
            .collect();
        for rs in &m.resource_spans {
            let service = service_name(rs.resource.as_ref());
            for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                rows += 1;
                strs[0].append_value(hex::encode(&span.trace_id));
                strs[1].append_value(hex::encode(&span.span_id));
                if span.parent_span_id.is_empty() {
                    strs[2].append_null()
                } else {
                    strs[2].append_value(hex::encode(&span.parent_span_id))
                }
                strs[3].append_value(service);
                strs[4].append_value(&span.name);
                strs[5].append_value(KINDS.get(span.kind as usize).unwrap_or(&"UNSPECIFIED"));
                strs[6].append_value(
                    STATUS
                        .get(span.status.as_ref().map_or(0, |s| s.code) as usize)
                        .unwrap_or(&"UNSET"),
                );
                times[0].append_value(span.start_time_unix_nano as i64);
                times[1].append_value(span.end_time_unix_nano as i64);
                ints[0].append_value((span.end_time_unix_nano - span.start_time_unix_nano) as i64);
                let attr = |name: &str| {
                    span.attributes
                        .iter()
                        .find(|kv| {
                            kv.key == name
                                || ALIASES
                                    .iter()
                                    .any(|(old, new)| *new == name && kv.key == *old)
                        })
                        .and_then(|kv| kv.value.as_ref())
                        .and_then(|v| v.value.clone())
                };
                for (b, c) in strs[7..].iter_mut().zip(STR_COLUMNS) {
                    match attr(c) {
                        Some(any_value::Value::StringValue(s)) => b.append_value(s),
                        _ => b.append_null(),
                    }
                }
                for (b, c) in ints[1..].iter_mut().zip(INT_COLUMNS) {
                    match attr(c) {
                        Some(any_value::Value::IntValue(v)) => b.append_value(v),
                        _ => b.append_null(),
                    }
                }
                for (b, c) in floats.iter_mut().zip(F64_COLUMNS) {
                    match attr(c) {
                        Some(any_value::Value::DoubleValue(v)) => b.append_value(v),
                        _ => b.append_null(),
                    }
                }
            }
        }
        let mut columns: Vec<ArrayRef> = Vec::new();
        let mut strs = strs.into_iter();
        for _ in 0..7 {
            columns.push(Arc::new(strs.next().expect("column").finish()));
        }
        for mut t in times {
            columns.push(Arc::new(t.finish()));
        }
        let mut ints = ints.into_iter();
        columns.push(Arc::new(ints.next().expect("duration").finish()));
        columns.extend(strs.map(|mut b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(ints.map(|mut b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(
            floats
                .into_iter()
                .map(|mut b| Arc::new(b.finish()) as ArrayRef),
        );
        writer.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
    }
    writer.close()?;
    Ok(rows)
}

/// Writes the log records of `messages` as one flat Parquet file (the peers' copy): time,
/// service, severity, body (text) and trace id; the records' count and time range.
pub fn write_logs_parquet(
    path: &Path,
    messages: impl Iterator<
        Item = opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest,
    >,
) -> anyhow::Result<(usize, u64, u64)> {
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("service_name", DataType::Utf8, false),
        Field::new("severity_text", DataType::Utf8, false),
        Field::new("body", DataType::Utf8, true),
        Field::new("trace_id", DataType::Utf8, true),
    ]));
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(path)?, schema.clone(), Some(props))?;
    let (mut rows, mut first, mut last) = (0, u64::MAX, 0);
    for m in messages {
        let mut time = TimestampNanosecondBuilder::new().with_timezone("UTC");
        let mut strs: Vec<StringBuilder> = (0..4).map(|_| StringBuilder::new()).collect();
        for rl in &m.resource_logs {
            let service = service_name(rl.resource.as_ref());
            for l in rl.scope_logs.iter().flat_map(|s| &s.log_records) {
                rows += 1;
                first = first.min(l.time_unix_nano);
                last = last.max(l.time_unix_nano);
                time.append_value(l.time_unix_nano as i64);
                strs[0].append_value(service);
                strs[1].append_value(&l.severity_text);
                match l.body.as_ref().and_then(|b| b.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => strs[2].append_value(s),
                    _ => strs[2].append_null(),
                }
                if l.trace_id.is_empty() {
                    strs[3].append_null()
                } else {
                    strs[3].append_value(hex::encode(&l.trace_id))
                }
            }
        }
        let mut columns: Vec<ArrayRef> = vec![Arc::new(time.finish())];
        columns.extend(strs.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        writer.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
    }
    writer.close()?;
    Ok((rows, first, last))
}
