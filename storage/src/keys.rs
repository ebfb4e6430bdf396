//! RocksDB key layout. Every key starts with the tenant, so one tenant's data is one key range
//! and a query can never wander into another tenant's rows.
//!
//! ```text
//! tenant   := len:u8 bytes
//! head     := tenant 'H' seq:u64be                            (column family "head")
//! chunk    := tenant 'B' window:u64be block:u64be column-name  (one column chunk)
//! meta     := tenant 'M' window:u64be block:u64be              (block meta, see block::format)
//! traces   := tenant 'S' window:u64be block:u64be              (per-trace summaries of a block)
//! postings := tenant 'P' window:u64be block:u64be dimension    (term -> roaring bitmap of rows)
//! trace-id := tenant 'X' trace:16 window:u64be block:u64be     (value: row start, row count)
//! ```
//! All integers are big-endian so that byte order is numeric order: the blocks of one time
//! window are adjacent and a window is dropped with one range delete per kind.

use crate::model::{TenantId, TraceId};

pub const HEAD: u8 = b'H';
pub const CHUNK: u8 = b'B';
pub const META: u8 = b'M';
pub const TRACES: u8 = b'S';
pub const POSTINGS: u8 = b'P';
pub const TRACE_ID: u8 = b'X';

/// A block's address: its time window and its id (unique per store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockAddr {
    pub window: u64,
    pub block: u64,
}

pub fn tenant_prefix(tenant: &TenantId) -> Vec<u8> {
    let t = tenant.as_str().as_bytes();
    let mut k = Vec::with_capacity(t.len() + 40);
    k.push(t.len() as u8);
    k.extend_from_slice(t);
    k
}

pub fn kind_prefix(tenant: &TenantId, kind: u8) -> Vec<u8> {
    let mut k = tenant_prefix(tenant);
    k.push(kind);
    k
}

pub fn head(tenant: &TenantId, seq: u64) -> Vec<u8> {
    let mut k = kind_prefix(tenant, HEAD);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub fn block_key(tenant: &TenantId, kind: u8, addr: BlockAddr) -> Vec<u8> {
    let mut k = kind_prefix(tenant, kind);
    k.extend_from_slice(&addr.window.to_be_bytes());
    k.extend_from_slice(&addr.block.to_be_bytes());
    k
}

pub fn chunk(tenant: &TenantId, addr: BlockAddr, column: &str) -> Vec<u8> {
    let mut k = block_key(tenant, CHUNK, addr);
    k.extend_from_slice(column.as_bytes());
    k
}

pub fn postings(tenant: &TenantId, addr: BlockAddr, dim: &str) -> Vec<u8> {
    let mut k = block_key(tenant, POSTINGS, addr);
    k.extend_from_slice(dim.as_bytes());
    k
}

pub fn trace_id_prefix(tenant: &TenantId, trace: &TraceId) -> Vec<u8> {
    let mut k = kind_prefix(tenant, TRACE_ID);
    k.extend_from_slice(&trace.0);
    k
}

pub fn trace_id(tenant: &TenantId, trace: &TraceId, addr: BlockAddr) -> Vec<u8> {
    let mut k = trace_id_prefix(tenant, trace);
    k.extend_from_slice(&addr.window.to_be_bytes());
    k.extend_from_slice(&addr.block.to_be_bytes());
    k
}

/// Length of the trace-id prefix of a key (tenant, kind, trace id), for RocksDB's prefix bloom
/// filter; `None` for keys of other kinds.
pub fn trace_id_prefix_len(key: &[u8]) -> Option<usize> {
    let tenant_len = *key.first()? as usize;
    let kind = *key.get(1 + tenant_len)?;
    let len = 1 + tenant_len + 1 + 16;
    (kind == TRACE_ID && key.len() >= len).then_some(len)
}

/// Splits a key into (tenant, kind, rest).
pub fn split(key: &[u8]) -> Option<(&str, u8, &[u8])> {
    let tenant_len = *key.first()? as usize;
    let tenant = std::str::from_utf8(key.get(1..1 + tenant_len)?).ok()?;
    let kind = *key.get(1 + tenant_len)?;
    Some((tenant, kind, &key[2 + tenant_len..]))
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
        assert!(chunk(&a, early, "x") < chunk(&a, late, "a"));
        assert!(chunk(&a, late, "x") < chunk(&b, early, "a"));
        let k = trace_id(&a, &TraceId([7; 16]), late);
        assert_eq!(trace_id_prefix_len(&k), Some(1 + 1 + 1 + 16));
        assert_eq!(trace_id_prefix_len(&chunk(&a, late, "x")), None);
        let (tenant, kind, rest) = split(&k).unwrap();
        assert_eq!((tenant, kind), ("a", TRACE_ID));
        assert_eq!(read_addr(&rest[16..]), Some(late));
        assert_eq!(prefix_end(&[1, 0xff]), vec![2]);
    }
}
