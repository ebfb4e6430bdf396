//! Patched frame-of-reference bit packing: the chunk format of the two int64 core columns that
//! nearly every query reads, start-time gaps and durations.
//!
//! Each page of [`PAGE_ROWS`](super::format::PAGE_ROWS) values is stored as a base and a bit
//! width: a value is `base + unsigned(width bits)`. The few values outside that window (the
//! absolute start of each trace, a long request among token spans) are exceptions, kept whole
//! beside the page. The width is chosen per page to minimise its size, so the chunk is as small
//! as byte-stream-split + zstd on this data, while any one value reads in a few instructions
//! without decompressing its page: a query that needs the start of one span in every trace no
//! longer decodes whole pages of token spans.
//!
//! Layout (little endian): `magic:4="WPK1" rows:u32 page_rows:u32 pages:u32
//! page_offset:u32*pages`, then per page `base:i64 width:u8 exceptions:u32
//! exception_row:u16*exceptions exception_value:i64*exceptions words:u64*n` where the `n`
//! words hold `page_len * width` bits, value `i` at bit `i * width`, followed by one zero word
//! (so that a value straddling two words always finds the second). Exception rows are
//! ascending; their packed slots hold zero.

use crate::error::{Result, StorageError};

pub const MAGIC: &[u8; 4] = b"WPK1";

/// Bits one exception costs beyond its packed slot: its row (16) and its value (64).
const EXCEPTION_BITS: u64 = 80;

/// Whether a chunk is in this format (a Parquet chunk begins with `PAR1`).
pub fn is_packed(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Encodes values in pages of `page_rows` (at most 65,536).
pub fn encode(values: &[i64], page_rows: usize) -> Vec<u8> {
    assert!(
        (1..=1 << 16).contains(&page_rows),
        "page rows {page_rows} out of range"
    );
    let pages: Vec<&[i64]> = values.chunks(page_rows).collect();
    let mut out = Vec::with_capacity(16 + 4 * pages.len() + values.len() * 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    out.extend_from_slice(&(page_rows as u32).to_le_bytes());
    out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
    let directory = out.len();
    out.resize(directory + 4 * pages.len(), 0);
    for (p, page) in pages.iter().enumerate() {
        let offset = out.len() as u32;
        out[directory + 4 * p..directory + 4 * p + 4].copy_from_slice(&offset.to_le_bytes());
        encode_page(page, &mut out);
    }
    out
}

/// The base and width that make a page smallest: for each width, the window of `2^width`
/// holding the most values (two pointers over the sorted values), exceptions the rest.
fn choose(page: &[i64]) -> (i64, u8) {
    let mut sorted = page.to_vec();
    sorted.sort_unstable();
    let n = sorted.len() as u64;
    let span = |i: usize, j: usize| i128::from(sorted[j]) - i128::from(sorted[i]);
    // width 64 always fits every value
    let mut best = (n * 64, sorted[0], 64u8);
    for width in 0..64u8 {
        if n * u64::from(width) >= best.0 {
            break; // this width and wider cost more than the best already found
        }
        let window = 1i128 << width;
        let (mut i, mut most, mut most_at) = (0usize, 0usize, 0usize);
        for j in 0..sorted.len() {
            while span(i, j) >= window {
                i += 1;
            }
            if j + 1 - i > most {
                (most, most_at) = (j + 1 - i, i);
            }
        }
        let bits = n * u64::from(width) + (n - most as u64) * EXCEPTION_BITS;
        if bits < best.0 {
            best = (bits, sorted[most_at], width);
        }
        if most == sorted.len() {
            break; // wider windows only cost more
        }
    }
    (best.1, best.2)
}

fn encode_page(page: &[i64], out: &mut Vec<u8>) {
    let (base, width) = choose(page);
    let fits = |v: i64| width == 64 || (v.wrapping_sub(base) as u64) >> width == 0 && v >= base;
    let exceptions: Vec<(u16, i64)> = page
        .iter()
        .enumerate()
        .filter(|(_, v)| !fits(**v))
        .map(|(i, v)| (i as u16, *v))
        .collect();
    out.extend_from_slice(&base.to_le_bytes());
    out.push(width);
    out.extend_from_slice(&(exceptions.len() as u32).to_le_bytes());
    for (row, _) in &exceptions {
        out.extend_from_slice(&row.to_le_bytes());
    }
    for (_, value) in &exceptions {
        out.extend_from_slice(&value.to_le_bytes());
    }
    let w = u64::from(width);
    let mut words = vec![0u64; (page.len() as u64 * w).div_ceil(64) as usize + 1];
    if width > 0 {
        for (i, v) in page.iter().enumerate() {
            if !fits(*v) {
                continue;
            }
            let bits = v.wrapping_sub(base) as u64;
            let at = i as u64 * w;
            let (word, shift) = ((at / 64) as usize, at % 64);
            words[word] |= bits << shift;
            if shift + w > 64 {
                words[word + 1] |= bits >> (64 - shift);
            }
        }
    }
    for word in words {
        out.extend_from_slice(&word.to_le_bytes());
    }
}

/// Unpacks `out.len()` values of `W` bits (at most 56, so that any value lies within the
/// eight bytes from its first byte). Eight values fill exactly `W` bytes: each group of eight
/// is read with offsets and shifts known at compile time, one bounds check per group.
fn unpack_fixed<const W: usize>(words: &[u8], base: i64, out: &mut [i64]) {
    let mask = (1u64 << W) - 1;
    let at = |bytes: &[u8], bit: usize| {
        let b = bit / 8;
        let chunk = u64::from_le_bytes(bytes[b..b + 8].try_into().expect("8 bytes"));
        base.wrapping_add(((chunk >> (bit % 8)) & mask) as i64)
    };
    let done = out.len() / 8 * 8;
    let mut groups = out.chunks_exact_mut(8);
    for (g, values) in groups.by_ref().enumerate() {
        // the group's W bytes and the 8 after them (the page ends in a zero word)
        let bytes = &words[g * W..g * W + W + 8];
        for (j, v) in values.iter_mut().enumerate() {
            *v = at(bytes, j * W);
        }
    }
    for (j, v) in groups.into_remainder().iter_mut().enumerate() {
        *v = at(words, (done + j) * W);
    }
}

/// Unpacks values wider than 56 bits, word by word through a 128-bit window.
fn unpack_wide(words: &[u8], base: i64, w: u32, out: &mut [i64]) {
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    let mut words = words
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
    // bits not yet consumed, lowest first
    let (mut acc, mut have) = (0u128, 0u32);
    for v in out {
        if have < w {
            acc |= u128::from(words.next().unwrap_or(0)) << have;
            have += 64;
        }
        *v = base.wrapping_add((acc as u64 & mask) as i64);
        acc >>= w;
        have -= w;
    }
}

fn corrupt(detail: impl Into<String>) -> StorageError {
    StorageError::corrupt("packed column chunk", detail)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| corrupt("truncated"))
}

/// A parsed chunk: its header; pages are parsed when read.
pub struct Packed<'a> {
    bytes: &'a [u8],
    rows: u32,
    page_rows: u32,
    pages: u32,
}

/// One page, parsed.
struct Page<'a> {
    first_row: u32,
    len: u32,
    base: i64,
    width: u32,
    exception_rows: &'a [u8],
    exception_values: &'a [u8],
    words: &'a [u8],
}

impl Page<'_> {
    fn word(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.words[8 * i..8 * i + 8].try_into().expect("8 bytes"))
    }

    /// The packed value of row `i` of the page (zero in an exception's slot).
    fn packed(&self, i: u32) -> i64 {
        if self.width == 0 {
            return self.base;
        }
        let w = u64::from(self.width);
        let at = u64::from(i) * w;
        let (word, shift) = ((at / 64) as usize, at % 64);
        let mut bits = self.word(word) >> shift;
        if shift + w > 64 {
            bits |= self.word(word + 1) << (64 - shift);
        }
        if w < 64 {
            bits &= (1u64 << w) - 1;
        }
        self.base.wrapping_add(bits as i64)
    }

    /// Appends every packed value of the page (zero in exceptions' slots).
    fn unpack_into(&self, out: &mut Vec<i64>) {
        let (base, w, len) = (self.base, self.width, self.len as usize);
        let at = out.len();
        out.resize(at + len, base);
        let out = &mut out[at..];
        if w == 0 {
            return;
        }
        macro_rules! fixed {
            ($($n:literal)*) => {
                match w {
                    $($n => unpack_fixed::<$n>(self.words, base, out),)*
                    _ => unpack_wide(self.words, base, w, out),
                }
            };
        }
        fixed!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28
            29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56);
    }

    fn exceptions(&self) -> impl Iterator<Item = (u32, i64)> + '_ {
        (0..self.exception_count()).map(|k| (self.exception_row(k), self.exception_value(k)))
    }

    fn exception_count(&self) -> usize {
        self.exception_rows.len() / 2
    }

    fn exception_row(&self, k: usize) -> u32 {
        let r = &self.exception_rows[2 * k..2 * k + 2];
        u32::from(u16::from_le_bytes(r.try_into().expect("2 bytes")))
    }

    /// The first exception at or after row `i`, searching from exception `from` (whose row
    /// must be below `i` or be the answer): a few steps in order, then by halves.
    fn first_exception_from(&self, i: u32, from: usize) -> usize {
        let n = self.exception_count();
        let near = (from + 8).min(n);
        let mut k = from;
        while k < near && self.exception_row(k) < i {
            k += 1;
        }
        if k < near || k == n {
            return k;
        }
        let (mut lo, mut hi) = (k, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.exception_row(mid) < i {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn exception_value(&self, k: usize) -> i64 {
        let v = &self.exception_values[8 * k..8 * k + 8];
        i64::from_le_bytes(v.try_into().expect("8 bytes"))
    }
}

impl<'a> Packed<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        if !is_packed(bytes) {
            return Err(corrupt("bad magic"));
        }
        let (rows, page_rows, pages) = (u32_at(bytes, 4)?, u32_at(bytes, 8)?, u32_at(bytes, 12)?);
        if page_rows == 0 || pages != rows.div_ceil(page_rows) {
            return Err(corrupt(format!(
                "{rows} rows in {pages} pages of {page_rows}"
            )));
        }
        if bytes.len() < 16 + 4 * pages as usize {
            return Err(corrupt("truncated page directory"));
        }
        Ok(Self {
            bytes,
            rows,
            page_rows,
            pages,
        })
    }

    pub fn rows(&self) -> u32 {
        self.rows
    }

    fn page(&self, p: u32) -> Result<Page<'a>> {
        let b = self.bytes;
        let at = u32_at(b, 16 + 4 * p as usize)? as usize;
        let first_row = p * self.page_rows;
        let len = self.page_rows.min(self.rows - first_row);
        let head = b
            .get(at..at + 13)
            .ok_or_else(|| corrupt("truncated page"))?;
        let base = i64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let width = u32::from(head[8]);
        let n = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes")) as usize;
        if width > 64 || n > len as usize {
            return Err(corrupt(format!("page {p}: width {width}, {n} exceptions")));
        }
        let words = (u64::from(len) * u64::from(width)).div_ceil(64) as usize + 1;
        let rows_at = at + 13;
        let values_at = rows_at + 2 * n;
        let words_at = values_at + 8 * n;
        let end = words_at + 8 * words;
        if b.len() < end {
            return Err(corrupt(format!("page {p} truncated")));
        }
        let page = Page {
            first_row,
            len,
            base,
            width,
            exception_rows: &b[rows_at..values_at],
            exception_values: &b[values_at..words_at],
            words: &b[words_at..end],
        };
        // exception rows are checked where they index (`all`), not here: a point read parses
        // the page for a few rows and would pay for walking all its exceptions
        Ok(page)
    }

    /// Every value.
    pub fn all(&self) -> Result<Vec<i64>> {
        let mut out = Vec::with_capacity(self.rows as usize);
        for p in 0..self.pages {
            let page = self.page(p)?;
            let at = out.len();
            page.unpack_into(&mut out);
            for (r, v) in page.exceptions() {
                if r >= page.len {
                    return Err(corrupt(format!("page {p}: exception past its end")));
                }
                out[at + r as usize] = v;
            }
        }
        Ok(out)
    }

    /// Loads the bytes at the given places (from [`Cursor::locate`]) and returns them folded
    /// into one. A caller about to read scattered rows touches a batch of them first: the loads
    /// of this short loop overlap, where the same loads one per row, each behind the work on
    /// the row before, would wait for memory one after another.
    pub fn touch(&self, places: &[usize]) -> u8 {
        places
            .iter()
            .fold(0, |x, &at| x ^ self.bytes.get(at).copied().unwrap_or(0))
    }

    /// A reader of row ranges that keeps the page it last parsed.
    pub fn cursor(&self) -> Cursor<'_, 'a> {
        Cursor {
            chunk: self,
            page: None,
            exception: (0, 0),
        }
    }

    /// The values of the given rows (ascending), each read on its own.
    pub fn pick(&self, rows: impl Iterator<Item = u32>) -> Result<Vec<i64>> {
        let mut out = Vec::with_capacity(rows.size_hint().0);
        // the page being read and the first of its exceptions not yet passed
        let mut current: Option<(u32, Page<'a>, usize)> = None;
        for row in rows {
            if row >= self.rows {
                return Err(corrupt(format!("row {row} of {}", self.rows)));
            }
            let p = row / self.page_rows;
            if current.as_ref().is_none_or(|c| c.0 != p) {
                current = Some((p, self.page(p)?, 0));
            }
            let (_, page, next) = current.as_mut().expect("just set");
            let i = row - page.first_row;
            let n = page.exception_count();
            if *next > 0 && page.exception_row(*next - 1) >= i {
                *next = 0; // rows out of order: search the page's exceptions again
            }
            while *next < n && page.exception_row(*next) < i {
                *next += 1;
            }
            out.push(if *next < n && page.exception_row(*next) == i {
                page.exception_value(*next)
            } else {
                page.packed(i)
            });
        }
        Ok(out)
    }
}

/// Reads runs of consecutive rows (see [`Packed::cursor`]): each run's values are unpacked in
/// sequence and its exceptions found by binary search, and a page is parsed once however many
/// runs fall in it, so a caller reading a few rows in each of many traces pays for those rows.
pub struct Cursor<'c, 'a> {
    chunk: &'c Packed<'a>,
    page: Option<(u32, Page<'a>)>,
    /// In that page, the first exception at or after row `.0`, the start of the last range.
    exception: (u32, usize),
}

impl<'a> Cursor<'_, 'a> {
    /// Adds the places in the chunk that reading `row` will load (its packed value; on
    /// entering a page, the lines of the page's exceptions too), for [`Packed::touch`].
    pub fn locate(&mut self, row: u32, places: &mut Vec<usize>) {
        let chunk = self.chunk;
        if row >= chunk.rows {
            return;
        }
        let p = row / chunk.page_rows;
        let at = |part: &[u8]| part.as_ptr() as usize - chunk.bytes.as_ptr() as usize;
        if self.page.as_ref().is_none_or(|(at, _)| *at != p) {
            let Ok(page) = chunk.page(p) else {
                return;
            };
            for part in [page.exception_rows, page.exception_values] {
                places.extend((0..part.len()).step_by(64).map(|i| at(part) + i));
            }
            self.page = Some((p, page));
            self.exception = (0, 0);
        }
        let (_, page) = self.page.as_ref().expect("just set");
        let bit = u64::from(row - page.first_row) * u64::from(page.width);
        places.push(at(page.words) + (bit / 8) as usize);
    }

    /// Appends the values of rows `from..to`.
    pub fn range(&mut self, from: u32, to: u32, out: &mut Vec<i64>) -> Result<()> {
        let chunk = self.chunk;
        if from > to || to > chunk.rows {
            return Err(corrupt(format!("rows {from}..{to} of {}", chunk.rows)));
        }
        let mut row = from;
        while row < to {
            let p = row / chunk.page_rows;
            if self.page.as_ref().is_none_or(|(at, _)| *at != p) {
                self.page = Some((p, chunk.page(p)?));
                self.exception = (0, 0);
            }
            let (_, page) = self.page.as_ref().expect("just set");
            let (a, b) = (row - page.first_row, (to - page.first_row).min(page.len));
            let at = out.len();
            out.extend((a..b).map(|i| page.packed(i)));
            // the page's exceptions within a..b, searched from where the last range's began
            // when this one begins later (ranges read in order step over a few exceptions)
            let (last, hint) = self.exception;
            let first = page.first_exception_from(a, if a >= last { hint } else { 0 });
            self.exception = (a, first);
            for k in first..page.exception_count() {
                let r = page.exception_row(k);
                if r >= b {
                    break;
                }
                out[at + (r - a) as usize] = page.exception_value(k);
            }
            row = page.first_row + b;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(values: &[i64], page_rows: usize) -> Vec<u8> {
        let bytes = encode(values, page_rows);
        let chunk = Packed::parse(&bytes).unwrap();
        assert_eq!(chunk.rows() as usize, values.len());
        assert_eq!(chunk.all().unwrap(), values);
        let rows: Vec<u32> = (0..values.len() as u32).filter(|r| r % 3 != 1).collect();
        let want: Vec<i64> = rows.iter().map(|r| values[*r as usize]).collect();
        assert_eq!(chunk.pick(rows.into_iter()).unwrap(), want);
        // runs of rows, within and across pages, through one cursor
        let n = values.len() as u32;
        let mut cursor = chunk.cursor();
        for (from, len) in [(0, 3), (n / 2, 7), (n.saturating_sub(5), 5), (0, n), (1, 0)] {
            let (from, to) = (from.min(n), (from + len).min(n));
            let mut got = Vec::new();
            cursor.range(from, to, &mut got).unwrap();
            assert_eq!(
                got,
                &values[from as usize..to as usize],
                "rows {from}..{to}"
            );
        }
        assert!(cursor.range(0, n + 1, &mut Vec::new()).is_err());
        // short runs in order, as a sparse read asks them, then one behind the last
        let mut cursor = chunk.cursor();
        for from in (0..n).step_by(37).chain([1.min(n)]) {
            let to = (from + 3).min(n);
            let mut got = Vec::new();
            cursor.range(from, to, &mut got).unwrap();
            assert_eq!(
                got,
                &values[from as usize..to as usize],
                "rows {from}..{to}"
            );
        }
        let backwards: Vec<u32> = (0..values.len() as u32).rev().step_by(5).collect();
        let want: Vec<i64> = backwards.iter().map(|r| values[*r as usize]).collect();
        assert_eq!(chunk.pick(backwards.into_iter()).unwrap(), want);
        bytes
    }

    #[test]
    fn values_read_back_whole_and_one_by_one() {
        // token-like gaps with an absolute start now and then, and the extremes
        let mut values: Vec<i64> = (0..10_000)
            .map(|i: i64| {
                if i % 97 == 0 {
                    1_764_460_800_000_000_000 + i * 1_000
                } else {
                    (i * 7919) % 40_000 - 20
                }
            })
            .collect();
        values.extend([i64::MIN, i64::MAX, 0, -1, i64::MIN, i64::MAX]);
        let bytes = roundtrip(&values, 4096);
        // the gaps cost about two bytes each, not eight
        assert!(bytes.len() < values.len() * 3, "{} bytes", bytes.len());
        roundtrip(&[], 4096);
        roundtrip(&[5], 4096);
        roundtrip(&[7; 9000], 4096);
        roundtrip(&[i64::MIN, i64::MAX, 3], 2);
        let spread: Vec<i64> = (0..5000)
            .map(|i: i64| i.wrapping_mul(0x1E37_79B9_7F4A_7C15))
            .collect();
        roundtrip(&spread, 4096);
    }

    #[test]
    fn every_width_reads_back() {
        // values filling exactly `width` bits above a base, on pages whose lengths are and
        // are not multiples of the eight-value groups the unpacking works in
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for width in 0..=64u32 {
            for len in [1usize, 7, 8, 9, 63, 64, 65, 1000, 4096] {
                let base = -1_000_000_007i64;
                let values: Vec<i64> = (0..len)
                    .map(|i| {
                        let bits = match width {
                            0 => 0,
                            64 => next(),
                            w if i == 0 => (1u64 << w) - 1, // the widest value forces the width
                            w => next() & ((1u64 << w) - 1),
                        };
                        base.wrapping_add(bits as i64)
                    })
                    .collect();
                roundtrip(&values, 4096);
            }
        }
    }

    #[test]
    fn damaged_chunks_are_errors_not_panics() {
        let values: Vec<i64> = (0..5000).map(|i| i * 13 % 1000).collect();
        let bytes = encode(&values, 4096);
        for cut in [0, 3, 10, 17, 40, bytes.len() / 2, bytes.len() - 1] {
            let short = &bytes[..cut];
            let read = Packed::parse(short).and_then(|c| c.all());
            assert!(read.is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&0u32.to_le_bytes()); // pages of no rows
        assert!(Packed::parse(&bad).is_err());
        let chunk = Packed::parse(&bytes).unwrap();
        assert!(chunk.pick([5000u32].into_iter()).is_err());
    }
}
