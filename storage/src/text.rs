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
                let tokenizer = if *name == "body" { WORDS } else { FIELD_WORDS };
                let indexing = TextFieldIndexing::default()
                    .set_tokenizer(tokenizer)
                    .set_index_option(IndexRecordOption::WithFreqsAndPositions)
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

struct WindowIndex {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    /// The view of the last commit; swapped whole after each commit.
    view: Mutex<WindowView>,
    /// One update of this window at a time.
    writing: Mutex<()>,
}

/// Every tenant's text indexes, one per window.
pub struct TextIndex {
    root: PathBuf,
    fields: TextFields,
    windows: Mutex<HashMap<(TenantId, u64), Arc<WindowIndex>>>,
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
        let key = (tenant.clone(), window);
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = windows.get(&key) {
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
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(text_err)?;
        let blocks = Arc::new(read_payload(&index)?);
        let view = WindowView {
            searcher: reader.searcher(),
            blocks,
        };
        let w = Arc::new(WindowIndex {
            dir,
            index,
            reader,
            view: Mutex::new(view),
            writing: Mutex::new(()),
        });
        windows.insert(key, w.clone());
        Ok(Some(w))
    }

    /// What a window's index answers now (`None`: the window has no index).
    pub fn view(&self, tenant: &TenantId, window: u64) -> Result<Option<WindowView>> {
        Ok(self
            .window(tenant, window, false)?
            .map(|w| w.view.lock().unwrap_or_else(|e| e.into_inner()).clone()))
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
        let held = w
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .blocks
            .clone();
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
        w.reader.reload().map_err(text_err)?;
        *w.view.lock().unwrap_or_else(|e| e.into_inner()) = WindowView {
            searcher: w.reader.searcher(),
            blocks: Arc::new(blocks.clone()),
        };
        Ok(())
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
