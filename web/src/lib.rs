//! Weft's browser UI assets, embedded in the binary. For now this is the landing page of the
//! query port: what Weft is and where its APIs are. The trace-search UI, waterfall, lineage
//! graph and heatmaps come with their issues.
//!
//! It has no server code: `weft-api` serves these bytes.

/// The landing page served at `/`.
pub const INDEX_HTML: &str = include_str!("index.html");
