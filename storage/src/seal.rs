//! Checksums on everything a block and the write-ahead head store: every value written under a
//! block key (column chunks, postings, trace summaries, trace-id entries, the block meta) and
//! every head record ends in `crc32:u32le magic:"WCK1"`, the CRC-32 of what precedes it, and is
//! verified when it is read from RocksDB (not again on cache hits: caches hold verified bytes).
//! RocksDB checks its own files too (block checksums in SSTs, record checksums in its log); this
//! layer covers the value end to end, from the bytes the encoder made to the bytes a query
//! decodes, and names the block a damaged value belongs to.
//!
//! Values written before checksums (no trailer) read as they are.

use crate::error::StorageError;
use crate::keys::{BlockAddr, Signal};
use crate::model::TenantId;

pub const MAGIC: [u8; 4] = *b"WCK1";
const TRAILER: usize = 8;

/// `value` with its checksum trailer.
pub fn seal(mut value: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&value);
    value.extend_from_slice(&crc.to_le_bytes());
    value.extend_from_slice(&MAGIC);
    value
}

/// The payload of a sealed value after its checksum is verified; a value without a trailer
/// (written before checksums) as it is. `Err` describes the mismatch.
pub fn unseal(value: &[u8]) -> Result<&[u8], String> {
    let n = value.len();
    if n < TRAILER || value[n - 4..] != MAGIC {
        return Ok(value);
    }
    let body = &value[..n - TRAILER];
    let stored = u32::from_le_bytes(value[n - 8..n - 4].try_into().expect("4 bytes"));
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x}, {} bytes)",
            body.len()
        ));
    }
    Ok(body)
}

/// The error for a damaged part of a block.
pub fn damaged(
    tenant: &TenantId,
    signal: Signal,
    addr: BlockAddr,
    part: impl Into<String>,
    detail: impl Into<String>,
) -> StorageError {
    StorageError::CorruptBlock {
        tenant: tenant.to_string(),
        signal: signal.name(),
        block: format!("{}/{}", addr.window, addr.block),
        part: part.into(),
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flipped_bit_is_caught() {
        let sealed = seal(b"column chunk bytes".to_vec());
        assert_eq!(unseal(&sealed).unwrap(), b"column chunk bytes");
        for i in 0..(sealed.len() - 4) * 8 {
            let mut bad = sealed.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(unseal(&bad).is_err(), "bit {i}");
        }
        // a value written before checksums reads as it is
        assert_eq!(unseal(b"PAR1...PAR1").unwrap(), b"PAR1...PAR1");
        assert_eq!(unseal(b"").unwrap(), b"");
    }
}
