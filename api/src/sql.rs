//! SQL surfaces: `POST /api/v1/sql` over HTTP and the PostgreSQL wire protocol, both over
//! `weft_query::sql`.

pub mod encode;
pub mod http;
pub mod pg;
pub mod scram;
pub mod wire;
