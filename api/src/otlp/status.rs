//! The `google.rpc.Status` and `google.rpc.RetryInfo` messages OTLP answers carry, written
//! with prost so no extra proto crate is needed.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// A `RetryInfo` detail, which tells OTLP clients that RESOURCE_EXHAUSTED is worth retrying.
pub fn retry_info(ms: u64) -> Any {
    let delay = ProtoDuration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    };
    Any {
        type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
        value: RetryInfo {
            retry_delay: Some(delay),
        }
        .encode_to_vec(),
    }
}
