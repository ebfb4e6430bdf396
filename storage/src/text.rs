//! Full text over log records: a tantivy index per tenant and time window, beside RocksDB
//! (`<data dir>/text/<tenant hex>/<window>/`), so that retention drops a window's index with
//! its blocks. RocksDB stays the source of truth: a document is a block row (`block`, `row`
//! fast fields, plus `time`), no field is stored, and each commit's payload names the blocks it
//! holds. [`crate::Store`] brings a window's index up to its blocks after every flush, merge
//! and expiry, and at open (a crash between a block's commit and its index commit).
//!
//! Words are cut exactly as the log query language cuts them (runs of letters, digits and
//! `_`, lower-cased); the other fields (class, service, severity, model, …) are indexed by
//! their words and also whole (`class:prompt_input`).

pub mod tokenizer;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use roaring::RoaringBitmap;
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::query::Query;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term};

use crate::error::{Result, StorageError};
use crate::model::{LogRecord, TenantId};

/// Tokenizer of the body: the words of the text.
pub const WORDS: &str = "weft_words";
/// Tokenizer of the other fields: their words, then the whole value.
pub const FIELD_WORDS: &str = "weft_field";

/// The text fields, by the name the query language gives them.
pub const TEXT_FIELDS: &[&str] = &[
    "body",
    "class",
    "service",
    "severity",
    "model",
    "model_version",
    "finish_reason",
    "worker",
    "gpu",
    "event",
    "trace_id",
    "span_id",
];

/// The schema's fields.
#[derive(Clone, Debug)]
pub struct TextFields {
    pub schema: Schema,
    /// One per [`TEXT_FIELDS`] entry, in that order.
    pub text: Vec<Field>,
    pub block: Field,
    pub row: Field,
    pub time: Field,
}

impl TextFields {
    fn new() -> Self {
        let mut b = Schema::builder();
        let text = TEXT_FIELDS
            .iter()
            .map(|name| {
                // positions for the body's phrases; the other fields are short values, asked
                // by their words (a phrase there is checked on the records read)
                let (tokenizer, option) = if *name == "body" {
                    (WORDS, IndexRecordOption::WithFreqsAndPositions)
                } else {
                    (FIELD_WORDS, IndexRecordOption::Basic)
                };
                let indexing = TextFieldIndexing::default()
                    .set_tokenizer(tokenizer)
                    .set_index_option(option)
                    .set_fieldnorms(false);
                b.add_text_field(name, TextOptions::default().set_indexing_options(indexing))
            })
            .collect();
        let block = b.add_u64_field("block", INDEXED | FAST);
        let row = b.add_u64_field("row", FAST);
        let time = b.add_u64_field("time", FAST);
        Self {
            schema: b.build(),
            text,
            block,
            row,
            time,
        }
    }

    /// The field a query names (`body`, `class`, …).
    pub fn field(&self, name: &str) -> Option<Field> {
        TEXT_FIELDS
            .iter()
            .position(|f| *f == name)
            .map(|i| self.text[i])
    }

    /// The document of a block row.
    pub fn doc(&self, l: &LogRecord, block: u64, row: u32) -> TantivyDocument {
        let mut d = TantivyDocument::default();
        let s = &l.semantics;
        let values: [Option<String>; 12] = [
            l.body_text(),
            Some(s.class.as_str().to_owned()),
            Some(l.service_name().to_owned()),
            Some(l.severity_text.clone()),
            s.model.clone(),
            s.model_version.clone(),
            s.finish_reasons.as_ref().map(|r| r.join(" ")),
            s.worker.clone(),
            s.gpu.clone(),
            Some(l.event_name.clone()),
            l.trace_id.map(|t| t.to_hex()),
            l.span_id.map(|t| t.to_hex()),
        ];
        for (field, value) in self.text.iter().zip(values) {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                d.add_text(*field, v);
            }
        }
        d.add_u64(self.block, block);
        d.add_u64(self.row, u64::from(row));
        d.add_u64(self.time, l.time.0);
        d
    }
}

/// What one window's index can answer: a searcher and the blocks of the commit it reads.
#[derive(Clone)]
pub struct WindowView {
    pub searcher: Searcher,
    pub blocks: Arc<BTreeSet<u64>>,
}

/// A window's index, opened. Its reader (which opens every segment) is made on the first
/// read, so that checking a window against its blocks (at start, after a flush elsewhere)
/// reads only the index's `meta.json`.
struct WindowIndex {
    dir: PathBuf,
    index: Index,
    /// The blocks of the last commit.
    held: Mutex<Arc<BTreeSet<u64>>>,
    /// The reader and the view of the last commit (swapped whole after each commit), once
    /// something read.
    view: Mutex<Option<(IndexReader, WindowView)>>,
    /// One update of this window at a time.
    writing: Mutex<()>,
    /// When it was last used (a tick of [`TextIndex::clock`]), to close the least recently
    /// used window when too many are open.
    used: std::sync::atomic::AtomicU64,
}

impl WindowIndex {
    fn held(&self) -> Arc<BTreeSet<u64>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The view of the last commit, opening the reader on first use.
    fn view(&self) -> Result<WindowView> {
        let mut slot = self.view.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, view)) = slot.as_ref() {
            return Ok(view.clone());
        }
        let reader: IndexReader = self
            .index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(text_err)?;
        let view = WindowView {
            searcher: reader.searcher(),
            blocks: self.held(),
        };
        *slot = Some((reader, view.clone()));
        Ok(view)
    }

    /// After a commit that holds `blocks`: the open reader (if any) sees it.
    fn committed(&self, blocks: BTreeSet<u64>) -> Result<()> {
        let blocks = Arc::new(blocks);
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = blocks.clone();
        let mut slot = self.view.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((reader, view)) = slot.as_mut() {
            reader.reload().map_err(text_err)?;
            *view = WindowView {
                searcher: reader.searcher(),
                blocks,
            };
        }
        Ok(())
    }
}

/// How many windows' indexes stay open at most (beyond it, the least recently used one not
/// in use is closed; it opens again when next needed).
const OPEN_WINDOWS: usize = 64;

/// Every tenant's text indexes, one per window.
pub struct TextIndex {
    root: PathBuf,
    fields: TextFields,
    windows: Mutex<HashMap<(TenantId, u64), Arc<WindowIndex>>>,
    clock: std::sync::atomic::AtomicU64,
}

fn text_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Text(e.to_string())
}

/// The commit payload: the blocks the index holds.
fn payload(blocks: &BTreeSet<u64>) -> String {
    serde_json::json!({ "blocks": blocks }).to_string()
}

fn read_payload(index: &Index) -> Result<BTreeSet<u64>> {
    let metas = index.load_metas().map_err(text_err)?;
    let Some(p) = metas.payload else {
        return Ok(BTreeSet::new());
    };
    #[derive(serde::Deserialize)]
    struct Payload {
        blocks: BTreeSet<u64>,
    }
    Ok(serde_json::from_str::<Payload>(&p)
        .map_err(|e| StorageError::corrupt("text index payload", e.to_string()))?
        .blocks)
}

impl TextIndex {
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        std::fs::create_dir_all(&root)?;
        Ok(Self {
            root,
            fields: TextFields::new(),
            windows: Mutex::new(HashMap::new()),
            clock: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn fields(&self) -> &TextFields {
        &self.fields
    }

    fn dir_of(&self, tenant: &TenantId, window: u64) -> PathBuf {
        self.root
            .join(hex::encode(tenant.as_str()))
            .join(window.to_string())
    }

    /// The (tenant, window) pairs that have an index on disk.
    pub fn on_disk(&self) -> Result<Vec<(TenantId, u64)>> {
        let mut out = Vec::new();
        for t in std::fs::read_dir(&self.root)? {
            let t = t?;
            let Some(tenant) = hex::decode(t.file_name().as_encoded_bytes())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| TenantId::new(&s).ok())
            else {
                continue;
            };
            for w in std::fs::read_dir(t.path())? {
                if let Some(window) = w?.file_name().to_str().and_then(|s| s.parse().ok()) {
                    out.push((tenant.clone(), window));
                }
            }
        }
        Ok(out)
    }

    fn window(
        &self,
        tenant: &TenantId,
        window: u64,
        create: bool,
    ) -> Result<Option<Arc<WindowIndex>>> {
        use std::sync::atomic::Ordering::Relaxed;
        let key = (tenant.clone(), window);
        let now = self.clock.fetch_add(1, Relaxed);
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = windows.get(&key) {
            w.used.store(now, Relaxed);
            return Ok(Some(w.clone()));
        }
        let dir = self.dir_of(tenant, window);
        let exists = dir.join("meta.json").exists();
        if !exists && !create {
            return Ok(None);
        }
        std::fs::create_dir_all(&dir)?;
        let mut index = if exists {
            Index::open_in_dir(&dir).map_err(text_err)?
        } else {
            Index::create_in_dir(&dir, self.fields.schema.clone()).map_err(text_err)?
        };
        index.set_tokenizers(tokenizer::manager());
        let held = Arc::new(read_payload(&index)?);
        let w = Arc::new(WindowIndex {
            dir,
            index,
            held: Mutex::new(held),
            view: Mutex::new(None),
            writing: Mutex::new(()),
            used: std::sync::atomic::AtomicU64::new(now),
        });
        if windows.len() >= OPEN_WINDOWS {
            // the least recently used window that nobody holds (a holder may be writing it:
            // a second instance of a window must never open a second writer)
            let idle = windows
                .iter()
                .filter(|(_, w)| Arc::strong_count(w) == 1)
                .min_by_key(|(_, w)| w.used.load(Relaxed))
                .map(|(k, _)| k.clone());
            if let Some(k) = idle {
                windows.remove(&k);
            }
        }
        windows.insert(key, w.clone());
        Ok(Some(w))
    }

    /// What a window's index answers now (`None`: the window has no index).
    pub fn view(&self, tenant: &TenantId, window: u64) -> Result<Option<WindowView>> {
        match self.window(tenant, window, false)? {
            Some(w) => Ok(Some(w.view()?)),
            None => Ok(None),
        }
    }

    /// Makes a window's index hold exactly `blocks`: documents of the blocks it lacks come
    /// from `docs_of` (called once per missing block), those of blocks it has and should not
    /// are deleted; one commit. An empty `blocks` removes the window's index.
    pub fn sync(
        &self,
        tenant: &TenantId,
        window: u64,
        blocks: &BTreeSet<u64>,
        mut docs_of: impl FnMut(u64) -> Result<Vec<TantivyDocument>>,
    ) -> Result<()> {
        let Some(w) = self.window(tenant, window, !blocks.is_empty())? else {
            return Ok(());
        };
        let _one = w.writing.lock().unwrap_or_else(|e| e.into_inner());
        let held = w.held();
        if blocks.is_empty() {
            self.windows
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(tenant.clone(), window));
            std::fs::remove_dir_all(&w.dir)?;
            return Ok(());
        }
        if *held == *blocks {
            return Ok(());
        }
        let mut writer: IndexWriter = w
            .index
            .writer_with_num_threads(1, 32 << 20)
            .map_err(text_err)?;
        for gone in held.difference(blocks) {
            writer.delete_term(Term::from_field_u64(self.fields.block, *gone));
        }
        for new in blocks.difference(&held) {
            for d in docs_of(*new)? {
                writer.add_document(d).map_err(text_err)?;
            }
        }
        let mut commit = writer.prepare_commit().map_err(text_err)?;
        commit.set_payload(&payload(blocks));
        commit.commit().map_err(text_err)?;
        writer.wait_merging_threads().map_err(text_err)?;
        w.committed(blocks.clone())
    }
}

impl WindowView {
    /// The rows of each block that match a query.
    pub fn hits(&self, query: &dyn Query) -> Result<HashMap<u64, RoaringBitmap>> {
        self.searcher.search(query, &BlockRows).map_err(text_err)
    }

    /// How many documents match a query.
    pub fn count(&self, query: &dyn Query) -> Result<usize> {
        query.count(&self.searcher).map_err(text_err)
    }
}

/// Collects (block, row) of every hit.
struct BlockRows;

struct SegmentRows {
    block: tantivy::columnar::Column<u64>,
    row: tantivy::columnar::Column<u64>,
    out: HashMap<u64, RoaringBitmap>,
}

impl Collector for BlockRows {
    type Fruit = HashMap<u64, RoaringBitmap>;
    type Child = SegmentRows;

    fn for_segment(
        &self,
        _: tantivy::SegmentOrdinal,
        segment: &tantivy::SegmentReader,
    ) -> tantivy::Result<SegmentRows> {
        let fast = segment.fast_fields();
        Ok(SegmentRows {
            block: fast.u64("block")?,
            row: fast.u64("row")?,
            out: HashMap::new(),
        })
    }

    fn requires_scoring(&self) -> bool {
        false
    }

    fn merge_fruits(
        &self,
        fruits: Vec<HashMap<u64, RoaringBitmap>>,
    ) -> tantivy::Result<HashMap<u64, RoaringBitmap>> {
        let mut all: HashMap<u64, RoaringBitmap> = HashMap::new();
        for f in fruits {
            for (block, rows) in f {
                *all.entry(block).or_default() |= rows;
            }
        }
        Ok(all)
    }
}

impl SegmentCollector for SegmentRows {
    type Fruit = HashMap<u64, RoaringBitmap>;

    fn collect(&mut self, doc: tantivy::DocId, _: tantivy::Score) {
        if let (Some(block), Some(row)) = (self.block.first(doc), self.row.first(doc)) {
            self.out.entry(block).or_default().insert(row as u32);
        }
    }

    fn harvest(self) -> HashMap<u64, RoaringBitmap> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use tantivy::query::TermQuery;

    use super::*;
    use crate::model::Value;

    impl TextIndex {
        /// (windows open, of which with a reader).
        fn open_counts(&self) -> (usize, usize) {
            let windows = self.windows.lock().unwrap();
            let readers = windows
                .values()
                .filter(|w| w.view.lock().unwrap().is_some())
                .count();
            (windows.len(), readers)
        }
    }

    #[test]
    fn checking_windows_opens_no_reader_and_open_windows_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId::new("t").unwrap();
        let windows = OPEN_WINDOWS as u64 + 6;
        let doc = |fields: &TextFields, w: u64| {
            let l = LogRecord {
                body: Value::Str(format!("refund window{w}")),
                ..Default::default()
            };
            fields.doc(&l, w, 0)
        };
        {
            let text = TextIndex::open(dir.path()).unwrap();
            for w in 0..windows {
                let blocks = BTreeSet::from([w]);
                text.sync(&t, w, &blocks, |b| Ok(vec![doc(text.fields(), b)]))
                    .unwrap();
            }
            let (open, _) = text.open_counts();
            assert!(open <= OPEN_WINDOWS, "{open} windows open");
        }
        // a start checks every window against its blocks: no segment is opened
        let text = TextIndex::open(dir.path()).unwrap();
        for w in 0..windows {
            let blocks = BTreeSet::from([w]);
            text.sync(&t, w, &blocks, |_| panic!("up to date: nothing to add"))
                .unwrap();
        }
        assert_eq!(text.open_counts().1, 0);
        // reading every window: each answers, and no more than the bound stay open
        let query = TermQuery::new(
            Term::from_field_text(text.fields().field("body").unwrap(), "refund"),
            IndexRecordOption::Basic,
        );
        for w in 0..windows {
            let view = text.view(&t, w).unwrap().unwrap();
            assert_eq!(view.count(&query).unwrap(), 1);
            assert_eq!(*view.blocks, BTreeSet::from([w]));
        }
        let (open, readers) = text.open_counts();
        assert!(
            open <= OPEN_WINDOWS && readers <= open,
            "{open} / {readers}"
        );
        // a window closed on the way opens again, and a new commit is seen
        let view = text.view(&t, 0).unwrap().unwrap();
        assert_eq!(view.count(&query).unwrap(), 1);
        let blocks = BTreeSet::from([0, 1000]);
        text.sync(&t, 0, &blocks, |b| Ok(vec![doc(text.fields(), b)]))
            .unwrap();
        let view = text.view(&t, 0).unwrap().unwrap();
        assert_eq!(view.count(&query).unwrap(), 2);
    }
}
