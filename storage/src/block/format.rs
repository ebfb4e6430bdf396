//! On-disk formats of a block.
//!
//! **Column chunk** (key `chunk`): a single-column Parquet file of one row group, no Arrow
//! metadata, pages of [`PAGE_ROWS`] rows with an offset index (so that a row range decodes only
//! its pages), zstd-compressed where that saves at least a tenth (else uncompressed, so that a
//! read creates no codec), with an encoding chosen per column ([`Enc`]): dictionary/RLE for
//! repeating strings and ids, delta-binary-packed for times and counters, byte-stream-split for
//! floats, plain for random ids. Parquet is the self-describing layer: a chunk is readable by any
//! Parquet reader. Start-time gaps and durations are the exception: bit-packed chunks
//! ([`super::packed`], magic `WPK1`), told apart from Parquet (`PAR1`) by their first bytes, so
//! blocks written before them read as before.
//!
//! **Block meta** (key `meta`), codec layout:
//! `version:u8=1 rows:varint min_start:varint max_start:varint max_end:varint
//!  ncols:varint (name:str type:u8 kind:u8 transform:u8 bytes:varint)*`; the transform's
//!  high bit ([`MINORITY_FLAG`]) marks a column stored over the block's minority rows only.
//!
//! **Trace summaries** (key `traces`, and one entry under each `trace-id` key):
//! `version:u8=2 n:varint` then per trace
//! `trace:16 row_start:varint rows:varint min_start:varint max_end:varint errors:varint
//!  has_root:u8 [root_service:str root_name:str root_start:varint root_span_id:8]` (the root is
//!  the trace's earliest root span in the block, ties by span id); or `version:u8=3
//!  len:varint zstd-frame`, the same after the version byte, compressed.
//!
//! **Postings** (key `postings`, one per dimension): `version:u8=1 n:varint` then per term
//! `term:str bitmap:bytes` where bitmap is a portable roaring serialisation of row numbers; or
//! `version:u8=2 len:varint zstd-frame`, the same after the version byte, compressed.
//!
//! **Rollups** (chunks `rollup_ops`, `rollup_heat`, `rollup_requests`): each rollup's own
//! encoding, version byte first (see `rollup`, `heat`, `requests`); or [`PACKED_ROLLUP`]
//! `len:varint zstd-frame`, the whole encoding compressed (blocks written before it read as
//! before).
//!
//! All are compressed where zstd saves at least a tenth: postings of low-cardinality
//! dimensions (kind, status, name) over rows ordered by trace are many small containers
//! that repeat from trace to trace, several times the size of the column they index.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::concat;
use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::{Compression as ParquetCompression, Encoding, ZstdLevel};
use parquet::file::metadata::PageIndexPolicy;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use roaring::RoaringBitmap;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{SpanId, TraceId};
use crate::schema::ColumnType;
use crate::summary::TraceRoot;

pub const META_VERSION: u8 = 1;
/// Trace summaries as they are ([`TRACES_PACKED`]: compressed).
pub const TRACES_VERSION: u8 = 2;
pub const TRACES_PACKED: u8 = 3;
/// Postings as they are ([`POSTINGS_PACKED`]: compressed).
pub const POSTINGS_VERSION: u8 = 1;
pub const POSTINGS_PACKED: u8 = 2;
/// The largest body a compressed value may claim (a block's postings of one dimension are a
/// few MiB at most).
const MAX_PACKED_BODY: u64 = 1 << 30;
/// Rows per Parquet page: the unit a point read decodes.
pub const PAGE_ROWS: usize = 4096;
const ZSTD_LEVEL: i32 = 3;

/// How a column chunk is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enc {
    /// Dictionary + RLE: strings and ids that repeat.
    Dict,
    /// Delta binary packed: times, sorted or slowly varying integers.
    Delta,
    /// Byte-stream-split: floats.
    Split,
    /// Plain: random ids, opaque blobs.
    Plain,
    /// Patched frame-of-reference bit packing ([`super::packed`], not Parquet): start-time
    /// gaps and durations, read by nearly every query, often a few rows per page.
    Packed,
}

/// What a column holds, so a reader knows how to put it back into a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ColumnKind {
    /// A fixed column of every block (ids, times, name, status, …).
    Core = 0,
    /// A dedicated LLM attribute column (`d:` + attribute name).
    Dedicated = 1,
    /// A dynamic attribute column of this block (`a:` + attribute key).
    Dynamic = 2,
}

/// How a column's values relate to what its chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Transform {
    /// The chunk holds the values.
    None = 0,
    /// The value is the span's duration in milliseconds (`duration_ns / 1e6`, bit for bit)
    /// wherever the chunk is not null: token latency attributes repeat the span duration, and
    /// storing them again would cost as much as the duration itself.
    DurationMillis = 1,
    /// Start times: the gap after the previous row's end, except on the first row of a trace
    /// or of a page, which holds the absolute time.
    GapAfterPreviousEnd = 2,
    /// A float that is a whole number of nanoseconds in milliseconds (`n / 1e6`, bit for bit)
    /// wherever set, stored as the integer `n - duration_ns`: a latency measured from the
    /// previous token is the span's duration plus the gap before it, a few bits instead of the
    /// float's eight bytes.
    MillisAfterDuration = 3,
}

/// The bit of a column's transform byte that says its chunk holds the block's minority rows
/// only (see [`ColumnMeta::minority`]).
pub const MINORITY_FLAG: u8 = 0x80;

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnMeta {
    pub name: String,
    pub ty: Option<ColumnType>,
    pub kind: ColumnKind,
    pub transform: Transform,
    /// The chunk holds one value per minority row of the block (the rows outside its dominant
    /// span name, listed by the `minor_rows` chunk), every other row being null: an attribute
    /// that only request spans carry (a model version, time to first token) is stored and
    /// read over those rows alone.
    pub minority: bool,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BlockMeta {
    pub rows: u32,
    pub min_start: u64,
    pub max_start: u64,
    pub max_end: u64,
    pub columns: Vec<ColumnMeta>,
}

impl BlockMeta {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.push(META_VERSION);
        w.u64(self.rows.into());
        w.u64(self.min_start);
        w.u64(self.max_start);
        w.u64(self.max_end);
        w.u64(self.columns.len() as u64);
        for c in &self.columns {
            w.str(&c.name);
            w.buf.push(c.ty.map_or(0xff, ColumnType::code));
            w.buf.push(c.kind as u8);
            w.buf
                .push(c.transform as u8 | if c.minority { MINORITY_FLAG } else { 0 });
            w.u64(c.bytes);
        }
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        let mut r = Reader::new(buf);
        check_version(&mut r, "block meta", META_VERSION)?;
        let rows = r.u32()?;
        let (min_start, max_start, max_end) = (r.u64()?, r.u64()?, r.u64()?);
        let n = r.u64()? as usize;
        let mut columns = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let name = r.string()?;
            let ty = ColumnType::from_code(r.u8()?);
            let kind = match r.u8()? {
                0 => ColumnKind::Core,
                1 => ColumnKind::Dedicated,
                2 => ColumnKind::Dynamic,
                k => {
                    return Err(StorageError::corrupt(
                        "block meta",
                        format!("column kind {k}"),
                    ));
                }
            };
            let byte = r.u8()?;
            let minority = byte & MINORITY_FLAG != 0;
            let transform = match byte & !MINORITY_FLAG {
                0 => Transform::None,
                1 => Transform::DurationMillis,
                2 => Transform::GapAfterPreviousEnd,
                3 => Transform::MillisAfterDuration,
                t => {
                    return Err(StorageError::corrupt(
                        "block meta",
                        format!("column transform {t}"),
                    ));
                }
            };
            columns.push(ColumnMeta {
                name,
                ty,
                kind,
                transform,
                minority,
                bytes: r.u64()?,
            });
        }
        Ok(Self {
            rows,
            min_start,
            max_start,
            max_end,
            columns,
        })
    }

    pub fn column(&self, name: &str) -> Option<&ColumnMeta> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn total_bytes(&self) -> u64 {
        self.columns.iter().map(|c| c.bytes).sum()
    }
}

fn check_version(r: &mut Reader<'_>, what: &'static str, supported: u8) -> Result<()> {
    let found = r.u8()?;
    if found == 0 || found > supported {
        return Err(StorageError::UnsupportedVersion {
            what,
            found,
            supported,
        });
    }
    Ok(())
}

/// One trace's rows in one block, with what a search result needs.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    pub trace_id: TraceId,
    pub row_start: u32,
    pub rows: u32,
    pub min_start: u64,
    pub max_end: u64,
    pub errors: u32,
    /// The earliest root span of the trace in this block, if any.
    pub root: Option<TraceRoot>,
}

pub fn encode_traces(entries: &[TraceEntry], compression: Compression) -> Vec<u8> {
    let mut w = Writer::default();
    w.buf.push(TRACES_VERSION);
    w.u64(entries.len() as u64);
    for e in entries {
        w.raw(&e.trace_id.0);
        w.u64(e.row_start.into());
        w.u64(e.rows.into());
        w.u64(e.min_start);
        w.u64(e.max_end);
        w.u64(e.errors.into());
        match &e.root {
            Some(root) => {
                w.buf.push(1);
                w.str(&root.service);
                w.str(&root.name);
                w.u64(root.start);
                w.raw(&root.span_id.0);
            }
            None => w.buf.push(0),
        }
    }
    pack(w.buf, TRACES_PACKED, compression)
}

pub fn decode_traces(buf: &[u8]) -> Result<Vec<TraceEntry>> {
    let body = unpack(buf, "trace summaries", TRACES_VERSION, TRACES_PACKED)?;
    let mut r = Reader::new(&body);
    let n = r.u64()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let trace_id = TraceId(r.raw(16)?.try_into().expect("16 bytes"));
        out.push(TraceEntry {
            trace_id,
            row_start: r.u32()?,
            rows: r.u32()?,
            min_start: r.u64()?,
            max_end: r.u64()?,
            errors: r.u32()?,
            root: match r.u8()? {
                0 => None,
                _ => Some(TraceRoot {
                    service: r.string()?,
                    name: r.string()?,
                    start: r.u64()?,
                    span_id: SpanId(r.raw(8)?.try_into().expect("8 bytes")),
                }),
            },
        });
    }
    Ok(out)
}

pub fn encode_postings(
    terms: &[(String, RoaringBitmap)],
    compression: Compression,
) -> Result<Vec<u8>> {
    let mut w = Writer::default();
    w.buf.push(POSTINGS_VERSION);
    w.u64(terms.len() as u64);
    let mut bitmap = Vec::new();
    for (term, rows) in terms {
        w.str(term);
        bitmap.clear();
        rows.serialize_into(&mut bitmap)?;
        w.bytes(&bitmap);
    }
    Ok(pack(w.buf, POSTINGS_PACKED, compression))
}

pub fn decode_postings(buf: &[u8]) -> Result<Vec<(String, RoaringBitmap)>> {
    let body = unpack(buf, "postings", POSTINGS_VERSION, POSTINGS_PACKED)?;
    let mut r = Reader::new(&body);
    let n = r.u64()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let term = r.string()?;
        let rows = RoaringBitmap::deserialize_from(r.bytes()?)?;
        out.push((term, rows));
    }
    Ok(out)
}

/// `value` (its raw version byte, then its body) as it is, or `packed` and the body
/// zstd-compressed where that saves at least a tenth (and `compression` allows).
fn pack(value: Vec<u8>, packed: u8, compression: Compression) -> Vec<u8> {
    compressed(packed, &value[1..], compression).unwrap_or(value)
}

/// `marker`, the length of `body` and `body` zstd-compressed, where that is at most nine
/// tenths of `body` (and `compression` allows).
fn compressed(marker: u8, body: &[u8], compression: Compression) -> Option<Vec<u8>> {
    if compression != Compression::Zstd || body.len() < 64 {
        return None;
    }
    let frame = zstd::bulk::compress(body, ZSTD_LEVEL).ok()?;
    let mut w = Writer::default();
    w.buf.push(marker);
    w.u64(body.len() as u64);
    w.raw(&frame);
    (w.buf.len() * 10 <= body.len() * 9).then_some(w.buf)
}

/// What [`compressed`] wrote after its marker: the length, then the frame.
fn decompressed(after_marker: &[u8], what: &'static str) -> Result<Vec<u8>> {
    let mut r = Reader::new(after_marker);
    let len = r.u64()?;
    if len > MAX_PACKED_BODY {
        return Err(StorageError::corrupt(what, format!("claims {len} bytes")));
    }
    let body = zstd::bulk::decompress(r.rest(), len as usize)
        .map_err(|e| StorageError::corrupt(what, format!("zstd: {e}")))?;
    if body.len() as u64 != len {
        return Err(StorageError::corrupt(
            what,
            format!("{} bytes where {len} were written", body.len()),
        ));
    }
    Ok(body)
}

/// The body of a value [`pack`] wrote: after a version from 1 to `raw` as it is, after
/// `packed` decompressed.
fn unpack<'a>(
    buf: &'a [u8],
    what: &'static str,
    raw: u8,
    packed: u8,
) -> Result<std::borrow::Cow<'a, [u8]>> {
    let mut r = Reader::new(buf);
    let found = r.u8()?;
    if found == packed {
        return Ok(decompressed(&buf[1..], what)?.into());
    }
    if found == 0 || found > raw {
        return Err(StorageError::UnsupportedVersion {
            what,
            found,
            supported: packed,
        });
    }
    Ok(buf[1..].into())
}

/// First byte of a compressed rollup chunk: no rollup's version.
pub const PACKED_ROLLUP: u8 = 0xff;

/// A rollup's encoding as it is, or [`PACKED_ROLLUP`] and the encoding zstd-compressed where
/// that saves at least a tenth (and `compression` allows).
pub fn pack_rollup(value: Vec<u8>, compression: Compression) -> Vec<u8> {
    compressed(PACKED_ROLLUP, &value, compression).unwrap_or(value)
}

/// The encoding of a rollup chunk [`pack_rollup`] wrote.
pub fn unpack_rollup<'a>(buf: &'a [u8], what: &'static str) -> Result<std::borrow::Cow<'a, [u8]>> {
    match buf.split_first() {
        Some((&PACKED_ROLLUP, rest)) => Ok(decompressed(rest, what)?.into()),
        _ => Ok(buf.into()),
    }
}

/// Whether column chunks may be compressed (zstd where it pays). Off, every value a row holds
/// is in the chunk whole, as it came (plain encoding past a dictionary), so that a byte search
/// of the data directory means something.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    Zstd,
    None,
}

/// Encodes one Arrow array as a single-column Parquet chunk, zstd-compressed where it pays.
#[cfg(test)]
pub fn encode_chunk(array: &ArrayRef, enc: Enc) -> Result<Vec<u8>> {
    encode_chunk_with(array, enc, Compression::Zstd)
}

/// [`encode_chunk`], compressed only when `compression` allows.
pub fn encode_chunk_with(array: &ArrayRef, enc: Enc, compression: Compression) -> Result<Vec<u8>> {
    if enc == Enc::Packed {
        let ints = array
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .filter(|a| arrow::array::Array::null_count(*a) == 0)
            .ok_or_else(|| {
                StorageError::corrupt("column", "only non-null int64 columns are bit-packed")
            })?;
        return Ok(super::packed::encode(ints.values(), PAGE_ROWS));
    }
    if compression == Compression::None {
        return write_parquet_chunk(array, enc, ParquetCompression::UNCOMPRESSED, true);
    }
    // Written plain first: most chunks (dictionary keys of a few values, random ids) do not
    // compress, and writing a chunk costs a dictionary lookup per row, so a chunk is written
    // a second time, with zstd, only when zstd over its plain bytes saves a tenth. Such chunks
    // are stored compressed if the pages compressed one by one still save a tenth; the rest
    // stay plain, so that a read creates no codec (zstd contexts).
    let plain = write_parquet_chunk(array, enc, ParquetCompression::UNCOMPRESSED, false)?;
    let pays = |compressed: usize| compressed * 10 <= plain.len() * 9;
    if !zstd::bulk::compress(&plain, ZSTD_LEVEL).is_ok_and(|z| pays(z.len())) {
        return Ok(plain);
    }
    let zstd = ParquetCompression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?);
    let out = write_parquet_chunk(array, enc, zstd, false)?;
    Ok(if pays(out.len()) { out } else { plain })
}

/// Column chunks by column name.
pub type NamedChunks = Vec<(String, Vec<u8>)>;

/// Encodes the columns of a block that has only fixed (core) columns: each chunk, and its
/// meta.
pub fn encode_core_columns(
    columns: Vec<(&'static str, ArrayRef, Enc)>,
    compression: Compression,
) -> Result<(Vec<ColumnMeta>, NamedChunks)> {
    let mut metas = Vec::with_capacity(columns.len());
    let mut chunks = Vec::with_capacity(columns.len());
    for (name, array, enc) in columns {
        let bytes = encode_chunk_with(&array, enc, compression)?;
        metas.push(ColumnMeta {
            name: name.to_owned(),
            ty: None,
            kind: ColumnKind::Core,
            transform: Transform::None,
            minority: false,
            bytes: bytes.len() as u64,
        });
        chunks.push((name.to_owned(), bytes));
    }
    Ok((metas, chunks))
}

fn write_parquet_chunk(
    array: &ArrayRef,
    enc: Enc,
    compression: ParquetCompression,
    verbatim: bool,
) -> Result<Vec<u8>> {
    let field = Field::new("v", array.data_type().clone(), true);
    let schema = Arc::new(Schema::new(vec![field]));
    let mut props = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(compression)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS)
        .set_max_row_group_row_count(Some(usize::MAX))
        .set_statistics_enabled(EnabledStatistics::None)
        .set_created_by(String::new());
    props = match enc {
        Enc::Dict => props.set_dictionary_enabled(true),
        Enc::Delta => props
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::DELTA_BINARY_PACKED),
        Enc::Split => props
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::BYTE_STREAM_SPLIT),
        Enc::Plain => props.set_dictionary_enabled(false),
        Enc::Packed => unreachable!("bit-packed chunks return above"),
    };
    if matches!(array.data_type(), DataType::FixedSizeBinary(_)) {
        // ids: plain, past a dictionary too, never prefix-delta-encoded (the writer's default
        // for byte arrays): random ids share no prefixes, and a delta-encoded page must be
        // decoded from its first value to reach any row, so a point read of a few span ids
        // decoded whole pages
        props = props.set_encoding(Encoding::PLAIN);
    }
    if verbatim && matches!(enc, Enc::Dict | Enc::Plain) {
        // values whole, as they came (not prefix-delta-encoded, the default for byte arrays
        // past the dictionary): what `Compression::None` promises
        props = props.set_encoding(Encoding::PLAIN);
    }
    let options = ArrowWriterOptions::new()
        .with_properties(props.build())
        .with_skip_arrow_metadata(true);
    let mut out = Vec::with_capacity(1024);
    let mut writer = ArrowWriter::try_new_with_options(&mut out, schema.clone(), options)?;
    writer.write(&RecordBatch::try_new(schema, vec![array.clone()])?)?;
    writer.close()?;
    Ok(out)
}

/// Parses a chunk's footer and page locations.
pub fn load_metadata(bytes: &Bytes) -> Result<ArrowReaderMetadata> {
    // Only the offset index (page locations) is written; it lets a selection skip pages.
    let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    Ok(ArrowReaderMetadata::load(bytes, options)?)
}

/// The same footer, read so that a string column decodes as string views: values of a
/// dictionary page are then shared by the rows instead of copied into each.
pub fn as_string_views(metadata: &ArrowReaderMetadata) -> Result<ArrowReaderMetadata> {
    let field = Field::new("v", arrow::datatypes::DataType::Utf8View, true);
    let options = ArrowReaderOptions::new()
        .with_offset_index_policy(PageIndexPolicy::Optional)
        .with_schema(Arc::new(Schema::new(vec![field])));
    Ok(ArrowReaderMetadata::try_new(
        metadata.metadata().clone(),
        options,
    )?)
}

/// Decodes a column chunk, optionally only the selected rows (only their pages are read).
#[cfg(test)]
pub fn decode_chunk(bytes: Bytes, selection: Option<RowSelection>) -> Result<ArrayRef> {
    Ok(decode_chunk_with(bytes, selection, None)?.0)
}

/// Like [`decode_chunk`], reusing the chunk's parsed footer and page index when the caller has
/// them; returns them for the caller to keep. A point read of a trace decodes one page of each
/// of a block's columns, and parsing each chunk's footer again would cost more than the page.
pub fn decode_chunk_with(
    bytes: Bytes,
    selection: Option<RowSelection>,
    metadata: Option<ArrowReaderMetadata>,
) -> Result<(ArrayRef, ArrowReaderMetadata)> {
    let metadata = match metadata {
        Some(m) => m,
        None => load_metadata(&bytes)?,
    };
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, metadata.clone());
    let rows = builder.metadata().file_metadata().num_rows().max(1) as usize;
    let mut builder = builder.with_batch_size(rows);
    let mut selects_none = false;
    if let Some(selection) = selection {
        selects_none = selection.row_count() == 0;
        builder = builder.with_row_selection(selection);
    }
    let batches = builder
        .build()?
        .map(|b| b.map(|b| b.column(0).clone()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let array = match batches.len() {
        0 if selects_none => {
            let field = metadata
                .schema()
                .fields()
                .first()
                .cloned()
                .ok_or_else(|| StorageError::corrupt("column chunk", "no column"))?;
            arrow::array::new_empty_array(field.data_type())
        }
        0 => return Err(StorageError::corrupt("column chunk", "no rows")),
        1 => batches.into_iter().next().expect("one batch"),
        _ => {
            let refs: Vec<&dyn arrow::array::Array> = batches.iter().map(|a| a.as_ref()).collect();
            concat(&refs)?
        }
    };
    Ok((array, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray};
    use parquet::arrow::arrow_reader::RowSelector;

    #[test]
    fn rollups_pack_where_it_pays_and_unpack_or_pass_through() {
        let what = "test rollup";
        // a repetitive encoding packs; its version byte comes back first
        let value: Vec<u8> = std::iter::once(2)
            .chain((0..4000).map(|i| (i % 7) as u8))
            .collect();
        let packed = pack_rollup(value.clone(), Compression::Zstd);
        assert_eq!(packed[0], PACKED_ROLLUP);
        assert!(packed.len() < value.len() / 2);
        assert!(*unpack_rollup(&packed, what).unwrap() == value[..]);
        // not with compression off, nor when it saves too little: read as written
        assert!(pack_rollup(value.clone(), Compression::None) == value);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = vec![1u8];
        noise.extend((0..4000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        }));
        assert!(pack_rollup(noise.clone(), Compression::Zstd) == noise);
        assert!(*unpack_rollup(&noise, what).unwrap() == noise[..]);
        // a damaged frame or length is an error, not a panic
        let mut bad = packed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        bad[1] ^= 0x01;
        assert!(unpack_rollup(&bad, what).is_err());
        assert!(unpack_rollup(&[PACKED_ROLLUP], what).is_err());
    }

    #[test]
    fn chunk_round_trips_whole_and_selected() {
        let values: Vec<i64> = (0..20_000).map(|i| i * 25_000_000 + (i % 7)).collect();
        let array: ArrayRef = Arc::new(Int64Array::from(values.clone()));
        let bytes = Bytes::from(encode_chunk(&array, Enc::Delta).unwrap());
        assert!(
            bytes.len() < values.len() * 3,
            "delta encoding should compress: {}",
            bytes.len()
        );
        let whole = decode_chunk(bytes.clone(), None).unwrap();
        assert_eq!(whole.as_ref(), array.as_ref());
        let sel = RowSelection::from(vec![RowSelector::skip(9000), RowSelector::select(3)]);
        let part = decode_chunk(bytes, Some(sel)).unwrap();
        let part = part.as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(part.values().as_ref(), &values[9000..9003]);
    }

    #[test]
    fn random_ids_are_plain_so_a_row_is_reached_without_its_page() {
        use arrow::array::FixedSizeBinaryArray;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let ids: Vec<[u8; 8]> = (0..20_000u64)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 29)).to_le_bytes())
            .collect();
        let array: ArrayRef = Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter()).unwrap());
        for enc in [Enc::Plain, Enc::Dict] {
            let bytes = Bytes::from(encode_chunk(&array, enc).unwrap());
            let reader = SerializedFileReader::new(bytes.clone()).unwrap();
            let encodings = reader
                .metadata()
                .row_group(0)
                .column(0)
                .encodings()
                .collect::<Vec<_>>();
            assert!(
                !encodings.contains(&Encoding::DELTA_BYTE_ARRAY),
                "{enc:?}: {encodings:?}"
            );
            let sel = RowSelection::from(vec![RowSelector::skip(12_345), RowSelector::select(2)]);
            let part = decode_chunk(bytes.clone(), Some(sel)).unwrap();
            assert_eq!(part.as_ref(), array.slice(12_345, 2).as_ref());
            if enc == Enc::Plain {
                // eight bytes an id, and little more
                assert!(bytes.len() < ids.len() * 8 + 2048, "{}", bytes.len());
            }
        }
    }

    #[test]
    fn dictionary_strings_with_nulls_round_trip() {
        let array: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            None,
            Some("a"),
            Some("b"),
        ]));
        let bytes = Bytes::from(encode_chunk(&array, Enc::Dict).unwrap());
        assert_eq!(decode_chunk(bytes, None).unwrap().as_ref(), array.as_ref());
    }

    #[test]
    fn chunks_are_compressed_only_where_it_pays() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let compression = |array: ArrayRef, enc: Enc| {
            let bytes = Bytes::from(encode_chunk(&array, enc).unwrap());
            assert_eq!(
                decode_chunk(bytes.clone(), None).unwrap().as_ref(),
                array.as_ref()
            );
            let reader = SerializedFileReader::new(bytes).unwrap();
            reader.metadata().row_group(0).column(0).compression()
        };
        // random ids: zstd finds nothing to save
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let ids: Vec<i64> = (0..20_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as i64
            })
            .collect();
        let ids: ArrayRef = Arc::new(Int64Array::from(ids));
        assert_eq!(
            compression(ids, Enc::Plain),
            ParquetCompression::UNCOMPRESSED
        );
        // repeated text: zstd saves most of it
        let text: Vec<String> = (0..20_000)
            .map(|i| format!("request {} of the batch was served", i % 50))
            .collect();
        let text: ArrayRef = Arc::new(StringArray::from(text));
        assert!(matches!(
            compression(text.clone(), Enc::Plain),
            ParquetCompression::ZSTD(_)
        ));
        // unless compression is off: then every value is in the chunk as it came
        let bytes = encode_chunk_with(&text, Enc::Plain, Compression::None).unwrap();
        let needle = b"request 49 of the batch was served";
        assert!(bytes.windows(needle.len()).any(|w| w == needle));
    }

    #[test]
    fn meta_traces_postings_round_trip() {
        let meta = BlockMeta {
            rows: 3,
            min_start: 1,
            max_start: 2,
            max_end: 9,
            columns: vec![
                ColumnMeta {
                    name: "d:llm.batch_size".into(),
                    ty: Some(ColumnType::Int),
                    kind: ColumnKind::Dedicated,
                    transform: Transform::DurationMillis,
                    minority: false,
                    bytes: 42,
                },
                ColumnMeta {
                    name: "d:llm.model_version".into(),
                    ty: Some(ColumnType::Str),
                    kind: ColumnKind::Dedicated,
                    transform: Transform::MillisAfterDuration,
                    minority: true,
                    bytes: 7,
                },
            ],
        };
        assert_eq!(BlockMeta::decode(&meta.encode()).unwrap(), meta);
        let traces = vec![TraceEntry {
            trace_id: TraceId([5; 16]),
            row_start: 0,
            rows: 3,
            min_start: 1,
            max_end: 9,
            errors: 1,
            root: Some(TraceRoot {
                start: 2,
                span_id: SpanId([3; 8]),
                service: "svc".into(),
                name: "GET /".into(),
            }),
        }];
        // one entry: compression would not pay, so it is stored as it is (version 2)
        let one = encode_traces(&traces, Compression::Zstd);
        assert_eq!(one[0], TRACES_VERSION);
        assert_eq!(decode_traces(&one).unwrap(), traces);
        let postings = vec![("v1".to_string(), RoaringBitmap::from_iter([1u32, 5, 9]))];
        let small = encode_postings(&postings, Compression::Zstd).unwrap();
        assert_eq!(small[0], POSTINGS_VERSION);
        assert_eq!(decode_postings(&small).unwrap(), postings);

        // many entries and interleaved rows (a block's kind over traces): compressed, and read
        // back the same; with compression off, the terms are in the value as they came
        let many: Vec<TraceEntry> = (0..500u32)
            .map(|i| TraceEntry {
                trace_id: TraceId([(i % 251) as u8; 16]),
                row_start: i * 40,
                rows: 40,
                ..traces[0].clone()
            })
            .collect();
        let packed = encode_traces(&many, Compression::Zstd);
        assert_eq!(packed[0], TRACES_PACKED);
        assert_eq!(decode_traces(&packed).unwrap(), many);
        let kinds: Vec<(String, RoaringBitmap)> = ["CLIENT", "INTERNAL", "SERVER"]
            .iter()
            .enumerate()
            .map(|(k, term)| {
                let rows = (0..200_000u32).filter(|r| (r % 37 % 3) as usize == k);
                (term.to_string(), RoaringBitmap::from_iter(rows))
            })
            .collect();
        let packed = encode_postings(&kinds, Compression::Zstd).unwrap();
        let plain = encode_postings(&kinds, Compression::None).unwrap();
        assert_eq!(packed[0], POSTINGS_PACKED);
        assert_eq!(plain[0], POSTINGS_VERSION);
        assert!(
            packed.len() * 2 < plain.len(),
            "{} vs {}",
            packed.len(),
            plain.len()
        );
        assert_eq!(decode_postings(&packed).unwrap(), kinds);
        assert_eq!(decode_postings(&plain).unwrap(), kinds);
        assert!(plain.windows(8).any(|w| w == b"INTERNAL"));
        // a compressed value cut short, or claiming more than it holds, is an error
        assert!(decode_postings(&packed[..packed.len() / 2]).is_err());
        let mut lying = vec![POSTINGS_PACKED];
        lying.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        lying.extend_from_slice(&packed[4..]);
        assert!(decode_postings(&lying).is_err());
        let mut future = plain.clone();
        future[0] = POSTINGS_PACKED + 1;
        assert!(matches!(
            decode_postings(&future),
            Err(StorageError::UnsupportedVersion { .. })
        ));
        let mut bad = meta.encode();
        bad[0] = 9;
        assert!(matches!(
            BlockMeta::decode(&bad),
            Err(StorageError::UnsupportedVersion { .. })
        ));
    }
}

#[cfg(test)]
mod size_probe {
    use super::*;
    use arrow::array::Int64Array;
    use rand::{Rng, SeedableRng};

    #[test]
    #[ignore = "prints encoded sizes of candidate encodings; run by hand"]
    fn probe() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let durs: Vec<i64> = (0..100_000)
            .map(|_| (25e6 * (1.0 + rng.random_range(-0.3..0.3))) as i64)
            .collect();
        let gaps: Vec<i64> = (0..100_000)
            .map(|_| rng.random_range(20_000..120_000))
            .collect();
        for (name, v) in [("durations", &durs), ("gaps", &gaps)] {
            let a: ArrayRef = Arc::new(Int64Array::from(v.clone()));
            for enc in [Enc::Delta, Enc::Plain, Enc::Dict] {
                println!(
                    "{name} {enc:?}: {:.3} bytes/value",
                    encode_chunk(&a, enc).unwrap().len() as f64 / v.len() as f64
                );
            }
        }
    }
}
