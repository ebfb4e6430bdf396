//! Admission of OTLP/gRPC request bodies as they stream in, before tonic has read a message:
//! the body budget OTLP/HTTP bodies share ([`Ingester::admit_body`], a fifth of
//! `--ingest-memory`, over every tenant). A body that would take more than is free is cut off
//! with RESOURCE_EXHAUSTED and a retry delay as its bytes arrive, so that slow or large exports
//! cannot make the server hold more than the budget while tonic collects them. The share is
//! held until the message is decoded; the export itself is then admitted by its size as on
//! every transport.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use weft_ingest::Ingester;

/// The [`tower::Layer`] that wraps each gRPC request's body in [`Admitted`].
#[derive(Clone)]
pub struct AdmitLayer(pub Arc<Ingester>);

impl<S> tower::Layer<S> for AdmitLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            ingester: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    ingester: Arc<Ingester>,
}

impl<S> tower::Service<http::Request<Body>> for Admit<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let body = Body::new(Admitted {
            inner: body,
            ingester: self.ingester.clone(),
            held: None,
            read: 0,
        });
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

/// A request body that takes its share of the body budget for every byte before handing it on.
pub struct Admitted {
    inner: Body,
    ingester: Arc<Ingester>,
    held: Option<OwnedSemaphorePermit>,
    read: usize,
}

impl http_body::Body for Admitted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            this.read += data.len();
            if let Err(e) = this.ingester.admit_body(&mut this.held, this.read) {
                return Poll::Ready(Some(Err(super::grpc::to_status(&e))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
