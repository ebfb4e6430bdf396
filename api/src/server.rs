//! Starting and stopping the server: open the store (replaying the write-ahead head), bind the
//! three listeners, start the store's background tasks, and on SIGTERM or SIGINT stop taking requests, flush the
//! head into blocks and close the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use weft_ingest::Ingester;
use weft_query::sql::SqlEngine;
use weft_storage::Store;

use crate::config::Config;
use crate::metrics::{self, RequestMetrics};
use crate::state::{AppState, SharedState};
use crate::{analytics, auth, jaeger, logs, loki, otlp, prometheus, sql, tempo, traces};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the store in {path}: {source}")]
    Store {
        path: String,
        source: weft_storage::StorageError,
    },
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{what} server failed: {detail}")]
    Server { what: &'static str, detail: String },
    #[error("final flush failed: {0}")]
    Close(weft_storage::StorageError),
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Tls(String),
    #[error(
        "refusing to listen on {0} without an auth file: give --auth-file FILE, or --insecure-no-auth to let anyone who reaches the port read and write every tenant"
    )]
    Insecure(SocketAddr),
}

/// The query port: health, metrics, the native API and the UI.
pub fn api_router(state: SharedState) -> Router {
    Router::new()
        .route("/", get(|| async { Html(weft_web::INDEX_HTML) }))
        .route("/ready", get(|| async { "ready\n" }))
        .route("/metrics", get(metrics_handler))
        .merge(traces::router())
        .merge(logs::router())
        .merge(prometheus::router())
        .merge(analytics::router())
        .merge(tempo::router())
        .merge(jaeger::router())
        .merge(loki::router())
        .merge(sql::http::router())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::damage::leave_out_damaged,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track_latency,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            (state.clone(), auth::Scope::Read),
            auth::http,
        ))
        .with_state(state)
}

async fn metrics_handler(State(state): State<SharedState>) -> impl IntoResponse {
    let text = metrics::render(&state.requests, &state.ingester, &state.store);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, what, source })
}

fn listen_addrs(config: &Config) -> impl Iterator<Item = SocketAddr> {
    [
        config.otlp_grpc_listen,
        config.otlp_http_listen,
        config.http_listen,
        config.pg_listen,
    ]
    .into_iter()
}

/// Serves `router` on `listener`, through TLS when it is configured, until `stop`.
async fn serve_http(
    listener: TcpListener,
    tls: Option<Arc<crate::tls::Tls>>,
    what: &'static str,
    router: Router,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    match tls {
        Some(tls) => {
            axum::serve(tls.listen(listener, &[b"http/1.1"], what), router)
                .with_graceful_shutdown(shutdown_signal(stop))
                .await
        }
        None => {
            // TCP_NODELAY: answers are written in several pieces (streamed SQL results);
            // without it Nagle's algorithm and delayed ACKs add tens of milliseconds to each.
            let nodelay = |s: &mut tokio::net::TcpStream| {
                let _ = s.set_nodelay(true);
            };
            axum::serve(listener.tap_io(nodelay), router)
                .with_graceful_shutdown(shutdown_signal(stop))
                .await
        }
    }
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

pub async fn run(config: Config) -> Result<(), ServeError> {
    let started = Instant::now();
    crate::metrics::count_panics();
    let auth = match &config.auth_file {
        Some(path) => Some(Arc::new(auth::Auth::load(path).map_err(ServeError::Auth)?)),
        None => {
            let open = listen_addrs(&config).find(|a| !a.ip().is_loopback());
            match open {
                Some(addr) if !config.insecure_no_auth => return Err(ServeError::Insecure(addr)),
                Some(addr) => {
                    tracing::warn!(%addr, "no auth file: every request is accepted, on a non-loopback address (--insecure-no-auth)")
                }
                None => tracing::info!(
                    "no auth file: every request is accepted (loopback addresses only)"
                ),
            }
            None
        }
    };
    let tls = match &config.tls {
        Some(paths) => Some(Arc::new(
            crate::tls::Tls::load(paths).map_err(ServeError::Tls)?,
        )),
        None => {
            if auth.is_some()
                && let Some(addr) = listen_addrs(&config).find(|a| !a.ip().is_loopback())
            {
                tracing::warn!(%addr, "tokens travel in clear on a non-loopback address: give --tls-cert and --tls-key");
            }
            None
        }
    };
    let path = config.data_dir.clone();
    let opts = config.store.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&path, opts))
        .await
        .expect("open task")
        .map_err(|source| ServeError::Store {
            path: config.data_dir.display().to_string(),
            source,
        })?;
    let store = Arc::new(store);
    let mut ingester =
        Ingester::new(store.clone(), config.limits).with_redaction(config.redaction.clone());
    if !config.span_metrics_interval.is_zero() {
        ingester = ingester.with_span_metrics();
    }
    let ingester = Arc::new(ingester);
    let state: SharedState = Arc::new(AppState {
        store: store.clone(),
        ingester,
        requests: RequestMetrics::with_tls_counter(
            tls.as_ref()
                .map(|t| t.failed_handshakes.clone())
                .unwrap_or_default(),
        ),
        sql: SqlEngine::new(store.clone(), config.sql.clone()),
        auth: auth.clone(),
        max_trace_spans: config.max_trace_spans,
    });

    let grpc_listener = bind(config.otlp_grpc_listen, "OTLP/gRPC").await?;
    let http_listener = bind(config.otlp_http_listen, "OTLP/HTTP").await?;
    let api_listener = bind(config.http_listen, "query API").await?;
    let pg_listener = bind(config.pg_listen, "PostgreSQL wire").await?;

    let background = store.start_background();
    let (stop_tx, stop_rx) = watch::channel(false);

    let grpc_auth = auth::GrpcAuth(auth.clone());
    let grpc_router = tonic::transport::Server::builder()
        .layer(otlp::admit::AdmitLayer(state.ingester.clone()))
        .add_service(InterceptedService::new(
            otlp::grpc::service(state.clone()),
            grpc_auth.clone(),
        ))
        .add_service(InterceptedService::new(
            otlp::grpc::logs_service(state.clone()),
            grpc_auth.clone(),
        ))
        .add_service(InterceptedService::new(
            otlp::grpc::metrics_service(state.clone()),
            grpc_auth,
        ));
    let grpc = {
        let tls = tls.clone();
        let stop = stop_rx.clone();
        async move {
            match tls {
                Some(tls) => {
                    let incoming = tls.listen(grpc_listener, &[b"h2"], "OTLP/gRPC");
                    grpc_router
                        .serve_with_incoming_shutdown(incoming.into_stream(), shutdown_signal(stop))
                        .await
                }
                None => {
                    grpc_router
                        .serve_with_incoming_shutdown(
                            tonic::transport::server::TcpIncoming::from(grpc_listener),
                            shutdown_signal(stop),
                        )
                        .await
                }
            }
        }
    };
    let otlp_http = serve_http(
        http_listener,
        tls.clone(),
        "OTLP/HTTP",
        otlp::http::router(state.clone()).route_layer(axum::middleware::from_fn_with_state(
            (state.clone(), auth::Scope::Write),
            auth::http,
        )),
        stop_rx.clone(),
    );
    let api = serve_http(
        api_listener,
        tls.clone(),
        "query API",
        api_router(state.clone()),
        stop_rx.clone(),
    );
    if auth.is_some() || tls.is_some() {
        let auth = auth.clone();
        let tls = tls.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                let Ok(mut hup) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                else {
                    return;
                };
                loop {
                    tokio::select! {
                        _ = hup.recv() => {}
                        _ = stop.changed() => break,
                    }
                    if let Some(auth) = &auth {
                        match auth.reload() {
                            Ok(n) => tracing::info!(tokens = n, "auth file read again"),
                            Err(e) => {
                                tracing::error!(error = %e, "auth file not read again; the tokens in force stay")
                            }
                        }
                    }
                    if let Some(tls) = &tls {
                        match tls.reload() {
                            Ok(()) => tracing::info!("TLS certificate and key read again"),
                            Err(e) => {
                                tracing::error!(error = %e, "TLS certificate not read again; the one in force stays")
                            }
                        }
                    }
                }
            }
        });
    }
    let pg = sql::pg::serve(
        pg_listener,
        tls.as_ref().map(|t| t.acceptor(&[b"postgresql"])),
        config.pg_max_connections,
        state.clone(),
        config.pg_password.clone(),
        shutdown_signal(stop_rx.clone()),
    );

    tracing::info!(
        data_dir = %config.data_dir.display(),
        otlp_grpc = %config.otlp_grpc_listen,
        otlp_http = %config.otlp_http_listen,
        http = %config.http_listen,
        pg = %config.pg_listen,
        tls = tls.is_some(),
        client_certificates = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        startup_ms = started.elapsed().as_millis() as u64,
        "weft is ready"
    );
    if config.gpu {
        match weft_ingest::gpu::nvml::NvmlGpus::open() {
            Ok(gpus) => {
                tracing::info!(every = ?config.gpu_interval, "GPU collector on");
                tokio::spawn(crate::gpu::run_local(
                    state.clone(),
                    Box::new(gpus),
                    config.gpu_interval,
                    stop_rx.clone(),
                ));
            }
            Err(e) => tracing::warn!("{e}; serving without it"),
        }
    }
    if !config.span_metrics_interval.is_zero() {
        let ingester = state.ingester.clone();
        let every = config.span_metrics_interval;
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                let ingester = ingester.clone();
                let result = tokio::task::spawn_blocking(move || ingester.flush_derived()).await;
                if let Ok(Err(e)) = result {
                    tracing::warn!(error = %e, "span-derived metrics not written; retried next interval");
                }
            }
        });
    }
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: no new requests, flushing");
        let _ = stop_tx.send(true);
    });
    let (g, h, a, p) = tokio::join!(
        async {
            grpc.await.map_err(|e| ServeError::Server {
                what: "OTLP/gRPC",
                detail: e.to_string(),
            })
        },
        async {
            otlp_http.await.map_err(|e| ServeError::Server {
                what: "OTLP/HTTP",
                detail: e.to_string(),
            })
        },
        async {
            api.await.map_err(|e| ServeError::Server {
                what: "query API",
                detail: e.to_string(),
            })
        },
        pg,
    );
    let closing = store.clone();
    let ingester = state.ingester.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = ingester.flush_derived() {
            tracing::warn!(error = %e, "span-derived metrics not written at stop");
        }
        background.stop();
        closing.close()
    })
    .await
    .expect("close task")
    .map_err(ServeError::Close)?;
    tracing::info!("store flushed and closed");
    g.and(h).and(a).and(Ok(p))
}
