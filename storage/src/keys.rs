//! RocksDB key layout, version [`KEY_VERSION`]. Every key starts with the tenant, then the
//! signal, so one tenant's data is one key range, one signal of it a sub-range, and a query can
//! never wander into another tenant's (or signal's) rows.
//!
//! ```text
//! tenant   := len:u8 bytes                                     (len >= 1)
//! signal   := u8                                               (see Signal)
//! head     := tenant signal 'H' seq:u64be                      (column family "head")
//! chunk    := tenant signal 'B' window:u64be block:u64be column-name  (one column chunk)
//! meta     := tenant signal 'M' window:u64be block:u64be       (block meta, see block::format)
//! traces   := tenant signal 'S' window:u64be block:u64be       (per-trace summaries of a block)
//! postings := tenant signal 'P' window:u64be block:u64be dimension (term -> roaring bitmap)
//! trace-id := tenant signal 'X' trace:16 window:u64be block:u64be  (value: that trace's summary)
//! grave    := tenant signal 'G' window:u64be block:u64be       (column family "meta", empty value)
//! split    := tenant signal 'J' trace:16                       (column family "meta", empty value)
//! series   := tenant signal 'R' series:u32be                   (column family "meta", a metric series)
//! format   := 0x00 "weft.format"                               (column family "meta")
//! ```
//! All integers are big-endian so that byte order is numeric order: the blocks of one time
//! window are adjacent and a window is dropped with one range delete per kind. The format key
//! cannot collide with a tenant's (a tenant name is never empty); its value is
//! `key_version:u8`, written when the store is created and checked at every open. A grave
//! marks a block taken out of the store (merged or out of retention) in the same write that
//! deleted its meta; its data is deleted once no reader holds it, and at the next open if the
//! process stopped before.

use crate::model::{TenantId, TraceId};

/// Version of this key layout (1 was the layout without a signal byte).
pub const KEY_VERSION: u8 = 2;
/// The key (in the meta column family) holding the store's format version.
pub const FORMAT: &[u8] = b"\0weft.format";

pub const HEAD: u8 = b'H';
pub const CHUNK: u8 = b'B';
pub const META: u8 = b'M';
pub const TRACES: u8 = b'S';
pub const POSTINGS: u8 = b'P';
pub const TRACE_ID: u8 = b'X';
/// A block whose meta is deleted and whose data waits to be (column family "meta").
pub const GRAVE: u8 = b'G';
/// A trace whose rows are in more than one block (column family "meta"): its request
/// dimensions are resolved over all of them (see `crate::request`).
pub const SPLIT: u8 = b'J';
/// A metric series of the tenant's catalog, by id (column family "meta").
pub const SERIES: u8 = b'R';

/// What kind of telemetry rows are: each signal has its own schema and its own key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Signal {
    Spans = 1,
    Logs = 2,
    Metrics = 3,
}

impl Signal {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Spans),
            2 => Some(Self::Logs),
            3 => Some(Self::Metrics),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Spans => "spans",
            Self::Logs => "logs",
            Self::Metrics => "metrics",
        }
    }
}

/// A block's address: its time window and its id (unique per store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockAddr {
    pub window: u64,
    pub block: u64,
}

/// The first key of a tenant's signal.
pub fn signal_prefix(tenant: &TenantId, signal: Signal) -> Vec<u8> {
    let t = tenant.as_str().as_bytes();
    let mut k = Vec::with_capacity(t.len() + 40);
    k.push(t.len() as u8);
    k.extend_from_slice(t);
    k.push(signal as u8);
    k
}

pub fn kind_prefix(tenant: &TenantId, signal: Signal, kind: u8) -> Vec<u8> {
    let mut k = signal_prefix(tenant, signal);
    k.push(kind);
    k
}

pub fn head(tenant: &TenantId, signal: Signal, seq: u64) -> Vec<u8> {
    let mut k = kind_prefix(tenant, signal, HEAD);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub fn block_key(tenant: &TenantId, signal: Signal, kind: u8, addr: BlockAddr) -> Vec<u8> {
    let mut k = kind_prefix(tenant, signal, kind);
    k.extend_from_slice(&addr.window.to_be_bytes());
    k.extend_from_slice(&addr.block.to_be_bytes());
    k
}

pub fn chunk(tenant: &TenantId, signal: Signal, addr: BlockAddr, column: &str) -> Vec<u8> {
    let mut k = block_key(tenant, signal, CHUNK, addr);
    k.extend_from_slice(column.as_bytes());
    k
}

pub fn series(tenant: &TenantId, id: u32) -> Vec<u8> {
    let mut k = kind_prefix(tenant, Signal::Metrics, SERIES);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub fn postings(tenant: &TenantId, signal: Signal, addr: BlockAddr, dim: &str) -> Vec<u8> {
    let mut k = block_key(tenant, signal, POSTINGS, addr);
    k.extend_from_slice(dim.as_bytes());
    k
}

pub fn split_trace(tenant: &TenantId, signal: Signal, trace: &TraceId) -> Vec<u8> {
    let mut k = kind_prefix(tenant, signal, SPLIT);
    k.extend_from_slice(&trace.0);
    k
}

pub fn trace_id_prefix(tenant: &TenantId, signal: Signal, trace: &TraceId) -> Vec<u8> {
    let mut k = kind_prefix(tenant, signal, TRACE_ID);
    k.extend_from_slice(&trace.0);
    k
}

pub fn trace_id(tenant: &TenantId, signal: Signal, trace: &TraceId, addr: BlockAddr) -> Vec<u8> {
    let mut k = trace_id_prefix(tenant, signal, trace);
    k.extend_from_slice(&addr.window.to_be_bytes());
    k.extend_from_slice(&addr.block.to_be_bytes());
    k
}

/// Length of the trace-id prefix of a key (tenant, signal, kind, trace id), for RocksDB's
/// prefix bloom filter; `None` for keys of other kinds.
pub fn trace_id_prefix_len(key: &[u8]) -> Option<usize> {
    let tenant_len = *key.first()? as usize;
    let kind = *key.get(2 + tenant_len)?;
    let len = 1 + tenant_len + 2 + 16;
    (tenant_len > 0 && kind == TRACE_ID && key.len() >= len).then_some(len)
}

/// A key split into its parts.
#[derive(Debug, PartialEq, Eq)]
pub struct Parts<'k> {
    pub tenant: &'k str,
    pub signal: Signal,
    pub kind: u8,
    pub rest: &'k [u8],
}

/// Splits a key into (tenant, signal, kind, rest); `None` for a key of no tenant's (the format
/// key) or of an unknown signal.
pub fn split(key: &[u8]) -> Option<Parts<'_>> {
    let tenant_len = *key.first()? as usize;
    if tenant_len == 0 {
        return None;
    }
    let tenant = std::str::from_utf8(key.get(1..1 + tenant_len)?).ok()?;
    let signal = Signal::from_byte(*key.get(1 + tenant_len)?)?;
    let kind = *key.get(2 + tenant_len)?;
    Some(Parts {
        tenant,
        signal,
        kind,
        rest: &key[3 + tenant_len..],
    })
}

pub fn read_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?))
}

pub fn read_addr(bytes: &[u8]) -> Option<BlockAddr> {
    Some(BlockAddr {
        window: read_u64(bytes)?,
        block: read_u64(bytes.get(8..)?)?,
    })
}

/// The first key after every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; prefix.len() + 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_tenant_then_kind_then_window() {
        let a = TenantId::new("a").unwrap();
        let b = TenantId::new("b").unwrap();
        let early = BlockAddr {
            window: 1,
            block: 9,
        };
        let late = BlockAddr {
            window: 2,
            block: 1,
        };
        let s = Signal::Spans;
        assert!(chunk(&a, s, early, "x") < chunk(&a, s, late, "a"));
        assert!(chunk(&a, s, late, "x") < chunk(&a, Signal::Logs, early, "a"));
        assert!(chunk(&a, Signal::Metrics, late, "x") < chunk(&b, s, early, "a"));
        let k = trace_id(&a, s, &TraceId([7; 16]), late);
        assert_eq!(trace_id_prefix_len(&k), Some(1 + 1 + 1 + 1 + 16));
        assert_eq!(trace_id_prefix_len(&chunk(&a, s, late, "x")), None);
        assert_eq!(trace_id_prefix_len(FORMAT), None);
        let parts = split(&k).unwrap();
        assert_eq!((parts.tenant, parts.signal, parts.kind), ("a", s, TRACE_ID));
        assert_eq!(read_addr(&parts.rest[16..]), Some(late));
        assert_eq!(split(FORMAT), None);
        assert_eq!(prefix_end(&[1, 0xff]), vec![2]);
    }
}
