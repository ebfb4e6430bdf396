//! The native trace API on the query port: a whole trace by id, and trace search.

pub(crate) mod get;
mod gpu;
pub(crate) mod search;

use axum::Router;
use axum::routing::get as get_route;

use crate::state::SharedState;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/api/v1/traces/{trace_id}", get_route(get::trace_by_id))
        .route("/api/v1/traces/{trace_id}/gpu", get_route(gpu::trace_gpu))
        .route("/api/v1/search", get_route(search::search))
}

#[cfg(test)]
mod tests;
