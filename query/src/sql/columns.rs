//! The columns of the tables, as storage's scan builds them (see [`weft_storage::scan`]), and
//! the conversions of its errors and arrays for DataFusion.

use arrow::array::ArrayRef;
use datafusion::error::{DataFusionError, Result};

pub use weft_storage::request::dedicated_value;
pub use weft_storage::scan::arrays::{
    hex_column, list_type, map_column, map_type, timestamp_type, typed_values, values_column,
};
pub use weft_storage::scan::spans::{SpanCol, SpanColumns};

pub(crate) fn storage_err(e: weft_storage::StorageError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A stored column as the array type a table expects (`table` names the table for the error).
pub(super) fn downcast<'a, T: 'static>(a: &'a ArrayRef, table: &str) -> Result<&'a T> {
    a.as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| DataFusionError::Internal(format!("{table} column of an unexpected type")))
}
