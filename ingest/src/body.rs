//! Request bodies: decompression with a hard size limit, so a small gzip bomb cannot expand
//! into unbounded memory.

use std::io::Read;

use flate2::read::GzDecoder;

use crate::error::IngestError;

/// Content encodings the receivers accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    pub fn from_header(value: Option<&str>) -> Result<Self, IngestError> {
        match value.map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(Self::Identity),
            Some(v) if v.is_empty() || v == "identity" => Ok(Self::Identity),
            Some(v) if v == "gzip" || v == "x-gzip" => Ok(Self::Gzip),
            Some(v) => Err(IngestError::Undecodable {
                format: "content-encoding",
                detail: format!("unsupported content encoding {v:?}: use gzip or identity"),
            }),
        }
    }
}

/// Returns the decoded body, refusing anything larger than `limit` bytes once decompressed.
pub fn decode(
    body: bytes::Bytes,
    encoding: Encoding,
    limit: usize,
) -> Result<bytes::Bytes, IngestError> {
    if body.len() > limit {
        return Err(IngestError::TooLarge {
            size: body.len(),
            limit,
        });
    }
    match encoding {
        Encoding::Identity => Ok(body),
        Encoding::Gzip => {
            let mut out = Vec::with_capacity(body.len() * 4);
            let mut reader = GzDecoder::new(&body[..]).take(limit as u64 + 1);
            reader
                .read_to_end(&mut out)
                .map_err(|e| IngestError::Undecodable {
                    format: "gzip",
                    detail: e.to_string(),
                })?;
            if out.len() > limit {
                return Err(IngestError::TooLarge {
                    size: out.len(),
                    limit,
                });
            }
            Ok(out.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;

    #[test]
    fn gzip_bomb_is_refused_at_the_limit() {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(&vec![0u8; 10 << 20]).unwrap();
        let small = enc.finish().unwrap();
        assert!(small.len() < 100_000);
        let err = decode(small.into(), Encoding::Gzip, 1 << 20).unwrap_err();
        assert!(matches!(err, IngestError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn gzip_round_trips_and_garbage_is_undecodable() {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(b"hello").unwrap();
        let out = decode(enc.finish().unwrap().into(), Encoding::Gzip, 100).unwrap();
        assert_eq!(&out[..], b"hello");
        assert!(decode(bytes::Bytes::from_static(b"nope"), Encoding::Gzip, 100).is_err());
        assert!(Encoding::from_header(Some("br")).is_err());
    }
}
