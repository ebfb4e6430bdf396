//! A log record in the write-ahead head: [`LOG_ROW_VERSION`], then its fields in
//! [`Writer::log`]'s order; ids are a presence byte then their raw bytes.

use std::sync::Arc;

use super::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{LogClass, LogRecord, LogSemantics, SpanId, TraceId, UnixNanos};

pub const LOG_ROW_VERSION: u8 = 1;

impl Writer {
    pub fn log(&mut self, l: &LogRecord) {
        self.buf.push(LOG_ROW_VERSION);
        self.u64(l.time.0);
        self.u64(l.observed_time.0);
        self.i64(l.severity_number.into());
        self.str(&l.severity_text);
        self.value(&l.body);
        self.attrs(&l.attributes);
        self.u64(l.dropped_attributes_count.into());
        self.u64(l.flags.into());
        self.optional(l.trace_id.as_ref().map(|t| &t.0[..]));
        self.optional(l.span_id.as_ref().map(|s| &s.0[..]));
        self.str(&l.event_name);
        self.resource(&l.resource);
        self.scope(&l.scope);
        self.semantics(&l.semantics);
    }

    fn semantics(&mut self, s: &LogSemantics) {
        self.buf.push(s.class as u8);
        let texts = [&s.model, &s.model_version, &s.worker, &s.gpu];
        for t in texts {
            match t {
                Some(t) => {
                    self.buf.push(1);
                    self.str(t);
                }
                None => self.buf.push(0),
            }
        }
        for i in [s.generation_step, s.output_tokens] {
            self.optional(i.map(|i| i.to_le_bytes()).as_ref().map(|b| &b[..]));
        }
        for f in [
            s.kv_cache_hit_rate,
            s.prefill_ms,
            s.decode_ms,
            s.tokens_per_s,
        ] {
            self.optional(f.map(f64::to_le_bytes).as_ref().map(|b| &b[..]));
        }
        match &s.finish_reasons {
            Some(reasons) => {
                self.buf.push(1);
                self.u64(reasons.len() as u64);
                reasons.iter().for_each(|r| self.str(r));
            }
            None => self.buf.push(0),
        }
    }

    fn optional(&mut self, bytes: Option<&[u8]>) {
        match bytes {
            Some(b) => {
                self.buf.push(1);
                self.raw(b);
            }
            None => self.buf.push(0),
        }
    }
}

impl Reader<'_> {
    pub fn log(&mut self) -> Result<LogRecord> {
        let version = self.u8()?;
        if version != LOG_ROW_VERSION {
            return Err(StorageError::UnsupportedVersion {
                what: "log row",
                found: version,
                supported: LOG_ROW_VERSION,
            });
        }
        Ok(LogRecord {
            time: UnixNanos(self.u64()?),
            observed_time: UnixNanos(self.u64()?),
            severity_number: i32::try_from(self.i64()?)
                .map_err(|_| StorageError::corrupt("log row", "severity out of range"))?,
            severity_text: self.string()?,
            body: self.value()?,
            attributes: self.attrs()?,
            dropped_attributes_count: self.u32()?,
            flags: self.u32()?,
            trace_id: self
                .present()?
                .then(|| self.array().map(TraceId))
                .transpose()?,
            span_id: self
                .present()?
                .then(|| self.array().map(SpanId))
                .transpose()?,
            event_name: self.string()?,
            resource: Arc::new(self.resource()?),
            scope: Arc::new(self.scope()?),
            semantics: self.semantics()?,
        })
    }

    fn semantics(&mut self) -> Result<LogSemantics> {
        let class = LogClass::from_u8(self.u8()?);
        let mut text =
            || -> Result<Option<String>> { self.present()?.then(|| self.string()).transpose() };
        let (model, model_version, worker, gpu) = (text()?, text()?, text()?, text()?);
        let mut int = || -> Result<Option<i64>> {
            self.present()?
                .then(|| self.array().map(i64::from_le_bytes))
                .transpose()
        };
        let (generation_step, output_tokens) = (int()?, int()?);
        let mut float = || -> Result<Option<f64>> {
            self.present()?
                .then(|| self.array().map(f64::from_le_bytes))
                .transpose()
        };
        let (kv_cache_hit_rate, prefill_ms, decode_ms, tokens_per_s) =
            (float()?, float()?, float()?, float()?);
        let finish_reasons = match self.present()? {
            true => {
                let n = self.u64()? as usize;
                let mut out = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    out.push(self.string()?);
                }
                Some(out)
            }
            false => None,
        };
        Ok(LogSemantics {
            class,
            model,
            model_version,
            generation_step,
            finish_reasons,
            output_tokens,
            kv_cache_hit_rate,
            prefill_ms,
            decode_ms,
            tokens_per_s,
            worker,
            gpu,
        })
    }

    fn present(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(StorageError::corrupt(
                "log row",
                format!("presence byte {b}"),
            )),
        }
    }
}

pub fn encode_logs(logs: &[LogRecord]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(logs.len() as u64);
    logs.iter().for_each(|l| w.log(l));
    w.buf
}

pub fn decode_logs(buf: &[u8]) -> Result<Vec<LogRecord>> {
    let mut r = Reader::new(buf);
    let n = r.u64()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        out.push(r.log()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KeyValue, Resource, Scope, Value};

    pub(crate) fn sample_log() -> LogRecord {
        LogRecord {
            time: UnixNanos(1_700_000_000_000_000_001),
            observed_time: UnixNanos(1_700_000_000_000_000_002),
            severity_number: 17,
            severity_text: "ERROR".into(),
            body: Value::KvList(vec![KeyValue::new("prefill_ms", Value::Double(12.5))]),
            attributes: vec![KeyValue::new("worker.id", Value::Str("w-7".into()))],
            dropped_attributes_count: 2,
            flags: 1,
            trace_id: Some(TraceId([9; 16])),
            span_id: None,
            event_name: "gen_ai.choice".into(),
            resource: Arc::new(Resource {
                attributes: vec![KeyValue::new("service.name", Value::Str("vllm".into()))],
                ..Default::default()
            }),
            scope: Arc::new(Scope {
                name: "vllm.logger".into(),
                ..Default::default()
            }),
            semantics: LogSemantics {
                class: LogClass::InferenceMetrics,
                model: Some("llama-3.1-8b".into()),
                generation_step: Some(-3),
                finish_reasons: Some(vec!["stop".into()]),
                prefill_ms: Some(12.5),
                gpu: Some("GPU-0".into()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn log_round_trips() {
        let logs = vec![sample_log(), LogRecord::default()];
        assert_eq!(decode_logs(&encode_logs(&logs)).unwrap(), logs);
    }

    #[test]
    fn truncated_log_is_an_error_not_a_panic() {
        let bytes = encode_logs(&[sample_log()]);
        for n in 0..bytes.len() {
            assert!(decode_logs(&bytes[..n]).is_err(), "prefix {n}");
        }
    }
}
