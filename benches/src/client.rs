//! A small HTTP/1.1 client for the benchmarks and end-to-end tests.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
}

/// A response: status, selected headers and the whole body.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub retry_after: Option<String>,
    /// The Content-Length header (absent from a streamed, chunked answer).
    pub content_length: Option<u64>,
    /// Every header.
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&self.body)?)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            inner: HyperClient::builder(TokioExecutor::new())
                .pool_max_idle_per_host(64)
                .build(connector),
        }
    }

    pub async fn request(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Reply> {
        let mut builder = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let resp = self.inner.request(builder.body(Full::new(body))?).await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let retry_after = header("retry-after");
        let content_length = header("content-length").and_then(|v| v.parse().ok());
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            content_type,
            retry_after,
            content_length,
            headers,
            body,
        })
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> anyhow::Result<Reply> {
        self.request(Method::GET, url, headers, Bytes::new()).await
    }

    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Reply> {
        self.request(Method::POST, url, headers, body.into()).await
    }
}
