//! Times and durations as people write them: the query crate's parsers, shared by every
//! surface (HTTP parameters and the analytics' SQL table functions read them alike).

pub use weft_query::time::*;
