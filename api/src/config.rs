//! Configuration: one typed struct, read from a TOML file (`--config`), environment variables
//! (`WEFT_*`) and flags, in rising order of precedence; parsed raw, then validated.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use weft_ingest::Limits;
use weft_query::sql::SqlConfig;
use weft_storage::StoreOptions;

use crate::time::parse_duration;

mod redaction;
mod retention;
use redaction::RedactionKeys;
use retention::RetentionKeys;

/// `weft serve` options. Each is also a `WEFT_*` environment variable and a key of the TOML
/// file (same name, `-` written `_`).
#[derive(Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// TOML configuration file; flags and environment variables override its keys.
    #[arg(long, env = "WEFT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Directory of the RocksDB store [default: ./weft-data].
    #[arg(long, env = "WEFT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// OTLP/gRPC listen address, host:port [default: 127.0.0.1:4317].
    #[arg(long, env = "WEFT_OTLP_GRPC_LISTEN")]
    pub otlp_grpc_listen: Option<String>,
    /// OTLP/HTTP listen address, host:port [default: 127.0.0.1:4318].
    #[arg(long, env = "WEFT_OTLP_HTTP_LISTEN")]
    pub otlp_http_listen: Option<String>,
    /// Query API, health and metrics listen address, host:port [default: 127.0.0.1:3200].
    #[arg(long, env = "WEFT_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Largest OTLP request body in bytes, compressed or decompressed [default: 16777216].
    #[arg(long, env = "WEFT_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Largest attribute value in bytes; spans with larger values are rejected [default: 1048576].
    #[arg(long, env = "WEFT_MAX_ATTRIBUTE_VALUE_BYTES")]
    pub max_attribute_value_bytes: Option<usize>,
    /// Attributes a span, event, link, log record or metric point may carry; a row with more
    /// is refused (partial success naming the limit); 0: no limit [default: 1024].
    #[arg(long, env = "WEFT_MAX_ATTRIBUTES")]
    pub max_attributes: Option<usize>,
    /// Longest attribute key in bytes; 0: no limit [default: 1024].
    #[arg(long, env = "WEFT_MAX_ATTRIBUTE_KEY_BYTES")]
    pub max_attribute_key_bytes: Option<usize>,
    /// Events a span may carry; 0: no limit [default: 16384].
    #[arg(long, env = "WEFT_MAX_SPAN_EVENTS")]
    pub max_span_events: Option<usize>,
    /// Links a span may carry; 0: no limit [default: 1024].
    #[arg(long, env = "WEFT_MAX_SPAN_LINKS")]
    pub max_span_links: Option<usize>,
    /// Memory ingest may hold, over every tenant: OTLP/HTTP bodies being read take a fifth
    /// (admitted from Content-Length before the body is read, and as it streams), requests
    /// being decoded and written the rest; past it, a retryable 429 / RESOURCE_EXHAUSTED
    /// [default: 268435456].
    #[arg(
        long = "ingest-memory",
        alias = "max-inflight-bytes",
        env = "WEFT_INGEST_MEMORY"
    )]
    pub max_inflight_bytes: Option<usize>,
    /// Requests decoded and written at once, over every tenant and signal; more wait their
    /// turn [default: twice the cores, plus two].
    #[arg(long, env = "WEFT_INGEST_WORKERS")]
    pub ingest_workers: Option<usize>,
    /// Rows that trigger a flush of the head into a block [default: 131072].
    #[arg(long, env = "WEFT_FLUSH_ROWS")]
    pub flush_rows: Option<usize>,
    /// Age of the oldest unflushed row that triggers a flush, e.g. 10s [default: 10s].
    #[arg(long, env = "WEFT_FLUSH_AGE")]
    pub flush_age: Option<String>,
    /// Unflushed rows above which writes get 429 until a flush catches up [default: 524288].
    #[arg(long, env = "WEFT_MAX_PENDING_ROWS")]
    pub max_pending_rows: Option<usize>,
    /// Memory the unflushed rows of all tenants may hold together, in bytes: past half of it
    /// every head is flushed, past it writes get a retryable 429 / RESOURCE_EXHAUSTED
    /// [default: 1073741824].
    #[arg(long, env = "WEFT_HEAD_MEMORY")]
    pub head_memory: Option<usize>,
    /// Time window of a block, e.g. 1h [default: 1h].
    #[arg(long, env = "WEFT_BLOCK_WINDOW")]
    pub block_window: Option<String>,
    /// RocksDB block cache in bytes [default: 134217728].
    #[arg(long, env = "WEFT_CACHE_BYTES")]
    pub cache_bytes: Option<usize>,
    /// Refuse writes (507, RESOURCE_EXHAUSTED; reads go on) while the data directory's
    /// filesystem has fewer free bytes than this; 0 never refuses [default: 268435456].
    #[arg(long, env = "WEFT_MIN_FREE_DISK")]
    pub min_free_disk: Option<u64>,
    /// Tenants the server takes data for; writes for one more are refused with 429 naming
    /// this limit; 0: no limit [default: 10000].
    #[arg(long, env = "WEFT_MAX_TENANTS")]
    pub max_tenants: Option<usize>,
    /// Spans a trace-by-id answer holds at most (the earliest), flagged as truncated beyond;
    /// 0: all [default: 100000].
    #[arg(long, env = "WEFT_MAX_TRACE_SPANS")]
    pub max_trace_spans: Option<usize>,
    /// A window that received no block for this long has its small blocks merged, e.g. 60s
    /// [default: 60s]; while it receives blocks, they are merged four of a size at a time.
    #[arg(long, env = "WEFT_MERGE_IDLE")]
    pub merge_idle: Option<String>,
    /// Flushes a trace may wait in the head for a span's missing parent, so that it reaches
    /// a block whole; 0 flushes every row at once [default: 2].
    #[arg(long, env = "WEFT_PARENT_WAIT_FLUSHES")]
    pub parent_wait_flushes: Option<u8>,
    /// Start even when a block meta or head record fails its checksum: leave it out and log it
    /// (its rows are not served) instead of refusing to start. `weft check` lists the damage.
    #[arg(long, env = "WEFT_SKIP_CORRUPT_BLOCKS")]
    pub skip_corrupt_blocks: bool,
    /// Run the NVML GPU collector in the server (points under the default tenant); without an
    /// NVIDIA driver it logs one line and the server runs without it [default: off].
    #[arg(long, env = "WEFT_GPU")]
    pub gpu: bool,
    /// How often the GPU collector samples, e.g. 10s [default: 10s].
    #[arg(long, env = "WEFT_GPU_INTERVAL")]
    pub gpu_interval: Option<String>,
    /// How often metrics derived from spans (span metrics, service graph, LLM latencies) are
    /// written, e.g. 15s; 0 turns their derivation off [default: 15s].
    #[arg(long, env = "WEFT_SPAN_METRICS_INTERVAL")]
    pub span_metrics_interval: Option<String>,
    /// Compression of column chunks: zstd (where it pays) or none, so that a byte search of
    /// the data directory finds every stored value [default: zstd].
    #[arg(long, env = "WEFT_COMPRESSION")]
    pub compression: Option<String>,
    /// How long rows are kept, e.g. 30d; 0 keeps them forever [default: 0]. Per tenant and per
    /// signal in the TOML file (`[tenants.NAME]`).
    #[arg(long, env = "WEFT_RETENTION")]
    pub retention: Option<String>,
    /// How long spans are kept, overriding --retention.
    #[arg(long, env = "WEFT_SPANS_RETENTION")]
    pub spans_retention: Option<String>,
    /// How long logs are kept, overriding --retention.
    #[arg(long, env = "WEFT_LOGS_RETENTION")]
    pub logs_retention: Option<String>,
    /// How long metric points are kept, overriding --retention.
    #[arg(long, env = "WEFT_METRICS_RETENTION")]
    pub metrics_retention: Option<String>,
    /// Keep content attributes (prompts, completions) as they came instead of a hash and a
    /// length [default: false]. Per tenant in the TOML file (`[tenants.NAME.redaction]`).
    #[arg(long, env = "WEFT_CAPTURE_CONTENT")]
    pub capture_content: Option<bool>,
    /// Replace personal data (e-mail addresses, phone and card numbers, API keys, bearer
    /// tokens, IP addresses) in log bodies and attributes by placeholders [default: true].
    #[arg(long, env = "WEFT_REDACT_PII")]
    pub redact_pii: Option<bool>,
    /// PostgreSQL wire protocol listen address, host:port [default: 127.0.0.1:5433].
    #[arg(long, env = "WEFT_PG_LISTEN")]
    pub pg_listen: Option<String>,
    /// Password PostgreSQL clients must give (md5 authentication); unset accepts any user.
    #[arg(long, env = "WEFT_PG_PASSWORD")]
    pub pg_password: Option<String>,
    /// Memory one SQL query may use in sorts, joins and aggregations, in bytes [default: 536870912].
    #[arg(long, env = "WEFT_SQL_MEMORY_LIMIT")]
    pub sql_memory_limit: Option<usize>,
    /// Longest a SQL query may run, results included, e.g. 60s [default: 60s].
    #[arg(long, env = "WEFT_SQL_TIMEOUT")]
    pub sql_timeout: Option<String>,
    /// Optimised SQL plans kept for queries sent again with the same text; 0 keeps none [default: 512].
    #[arg(long, env = "WEFT_SQL_PLAN_CACHE")]
    pub sql_plan_cache: Option<usize>,
    /// SQL queries (HTTP and PostgreSQL together) that may run at once; more wait for a turn
    /// [default: twice the cores, at least 4].
    #[arg(long, env = "WEFT_SQL_MAX_CONCURRENT")]
    pub sql_max_concurrent: Option<usize>,
    /// How long a query waits for a turn before 503 / SQLSTATE 53300, e.g. 5s [default: 5s].
    #[arg(long, env = "WEFT_SQL_QUEUE_WAIT")]
    pub sql_queue_wait: Option<String>,
    /// PostgreSQL connections open at once; more are refused with SQLSTATE 53300 [default: 256].
    #[arg(long, env = "WEFT_PG_MAX_CONNECTIONS")]
    pub pg_max_connections: Option<usize>,
    /// Log filter, e.g. info or weft=debug [default: info].
    #[arg(long, env = "WEFT_LOG")]
    pub log: Option<String>,
    /// Tokens (TOML: `[[token]]` with `sha256`, `tenant`, `scopes`) every request must carry;
    /// re-read on SIGHUP. Without it, every request is accepted and Weft listens on loopback
    /// addresses only.
    #[arg(long, env = "WEFT_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// Listen on non-loopback addresses without an auth file (anyone who reaches a port reads
    /// and writes every tenant).
    #[arg(long, env = "WEFT_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Serve TLS on every port with this PEM certificate chain (server certificate first);
    /// re-read on SIGHUP. Needs --tls-key.
    #[arg(long, env = "WEFT_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "WEFT_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Ask every client for a certificate signed by this PEM CA (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "WEFT_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

/// The TOML file: the same keys as the flags, all optional.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    otlp_grpc_listen: Option<String>,
    otlp_http_listen: Option<String>,
    http_listen: Option<String>,
    max_body_bytes: Option<usize>,
    max_attribute_value_bytes: Option<usize>,
    max_attributes: Option<usize>,
    max_attribute_key_bytes: Option<usize>,
    max_span_events: Option<usize>,
    max_span_links: Option<usize>,
    #[serde(alias = "ingest_memory")]
    max_inflight_bytes: Option<usize>,
    ingest_workers: Option<usize>,
    flush_rows: Option<usize>,
    flush_age: Option<String>,
    max_pending_rows: Option<usize>,
    head_memory: Option<usize>,
    block_window: Option<String>,
    cache_bytes: Option<usize>,
    min_free_disk: Option<u64>,
    max_tenants: Option<usize>,
    max_trace_spans: Option<usize>,
    merge_idle: Option<String>,
    parent_wait_flushes: Option<u8>,
    skip_corrupt_blocks: Option<bool>,
    span_metrics_interval: Option<String>,
    gpu: Option<bool>,
    gpu_interval: Option<String>,
    compression: Option<String>,
    retention: Option<String>,
    spans_retention: Option<String>,
    logs_retention: Option<String>,
    metrics_retention: Option<String>,
    /// Redaction of every tenant: `[redaction]`.
    redaction: Option<RedactionKeys>,
    /// Per-tenant settings: `[tenants.acme]` with retention keys and a `redaction` table.
    #[serde(default)]
    tenants: BTreeMap<String, RetentionKeys>,
    pg_listen: Option<String>,
    pg_password: Option<String>,
    sql_memory_limit: Option<usize>,
    sql_timeout: Option<String>,
    sql_plan_cache: Option<usize>,
    sql_max_concurrent: Option<usize>,
    sql_queue_wait: Option<String>,
    pg_max_connections: Option<usize>,
    /// Context windows by model (name or prefix): `[context_windows]`.
    #[serde(default)]
    context_windows: BTreeMap<String, u64>,
    log: Option<String>,
    auth_file: Option<PathBuf>,
    insecure_no_auth: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub otlp_grpc_listen: SocketAddr,
    pub otlp_http_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub limits: Limits,
    pub store: StoreOptions,
    pub pg_listen: SocketAddr,
    pub pg_password: Option<String>,
    /// PostgreSQL connections open at once.
    pub pg_max_connections: usize,
    /// Spans a trace-by-id answer holds at most.
    pub max_trace_spans: usize,
    pub sql: SqlConfig,
    pub redaction: weft_ingest::redact::RedactionPolicy,
    pub log: String,
    /// How often span-derived metrics are written; zero: not derived.
    pub span_metrics_interval: Duration,
    /// Whether the server runs the GPU collector, and how often it samples.
    pub gpu: bool,
    pub gpu_interval: Duration,
    /// The auth file, when requests must carry tokens.
    pub auth_file: Option<PathBuf>,
    /// Listen beyond loopback without an auth file.
    pub insecure_no_auth: bool,
    /// TLS on every listener, when configured.
    pub tls: Option<crate::tls::TlsPaths>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{key}: {detail}")]
    Invalid { key: &'static str, detail: String },
}

fn compression(value: Option<String>) -> Result<weft_storage::Compression, ConfigError> {
    use weft_storage::Compression;
    match value.as_deref() {
        None | Some("zstd") => Ok(Compression::Zstd),
        Some("none") => Ok(Compression::None),
        Some(other) => Err(ConfigError::Invalid {
            key: "compression",
            detail: format!("{other:?} is not zstd or none"),
        }),
    }
}

fn addr(
    key: &'static str,
    value: Option<String>,
    default: &str,
) -> Result<SocketAddr, ConfigError> {
    let text = value.unwrap_or_else(|| default.to_owned());
    text.parse().map_err(|_| ConfigError::Invalid {
        key,
        detail: format!(
            "{text:?} is not host:port (an IP address and a port, e.g. 127.0.0.1:3200)"
        ),
    })
}

fn duration(
    key: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => parse_duration(&v).map_err(|detail| ConfigError::Invalid { key, detail }),
    }
}

fn positive(key: &'static str, value: usize) -> Result<usize, ConfigError> {
    if value == 0 {
        return Err(ConfigError::Invalid {
            key,
            detail: "must be greater than 0".into(),
        });
    }
    Ok(value)
}

impl Config {
    pub fn load(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => Self::read_file(path)?,
            None => FileConfig::default(),
        };
        let limits_default = Limits::default();
        let store_default = StoreOptions::default();
        let limits = Limits {
            max_body_bytes: positive(
                "max_body_bytes",
                args.max_body_bytes
                    .or(file.max_body_bytes)
                    .unwrap_or(limits_default.max_body_bytes),
            )?,
            max_attribute_value_bytes: positive(
                "max_attribute_value_bytes",
                args.max_attribute_value_bytes
                    .or(file.max_attribute_value_bytes)
                    .unwrap_or(limits_default.max_attribute_value_bytes),
            )?,
            max_inflight_bytes: positive(
                "max_inflight_bytes",
                args.max_inflight_bytes
                    .or(file.max_inflight_bytes)
                    .unwrap_or(limits_default.max_inflight_bytes),
            )?,
            workers: positive(
                "ingest_workers",
                args.ingest_workers
                    .or(file.ingest_workers)
                    .unwrap_or(limits_default.workers),
            )?,
            shape: weft_ingest::otlp::convert::ShapeLimits {
                attributes: args
                    .max_attributes
                    .or(file.max_attributes)
                    .unwrap_or(limits_default.shape.attributes),
                key_bytes: args
                    .max_attribute_key_bytes
                    .or(file.max_attribute_key_bytes)
                    .unwrap_or(limits_default.shape.key_bytes),
                events: args
                    .max_span_events
                    .or(file.max_span_events)
                    .unwrap_or(limits_default.shape.events),
                links: args
                    .max_span_links
                    .or(file.max_span_links)
                    .unwrap_or(limits_default.shape.links),
            },
        };
        let mut store = StoreOptions {
            flush_rows: positive(
                "flush_rows",
                args.flush_rows
                    .or(file.flush_rows)
                    .unwrap_or(store_default.flush_rows),
            )?,
            flush_age: duration(
                "flush_age",
                args.flush_age.or(file.flush_age),
                store_default.flush_age,
            )?,
            max_pending_rows: positive(
                "max_pending_rows",
                args.max_pending_rows
                    .or(file.max_pending_rows)
                    .unwrap_or(store_default.max_pending_rows),
            )?,
            max_head_bytes: positive(
                "head_memory",
                args.head_memory
                    .or(file.head_memory)
                    .unwrap_or(store_default.max_head_bytes),
            )?,
            window: duration(
                "block_window",
                args.block_window.or(file.block_window),
                store_default.window,
            )?,
            cache_bytes: args
                .cache_bytes
                .or(file.cache_bytes)
                .unwrap_or(store_default.cache_bytes),
            min_free_disk: args
                .min_free_disk
                .or(file.min_free_disk)
                .unwrap_or(store_default.min_free_disk),
            max_tenants: args
                .max_tenants
                .or(file.max_tenants)
                .unwrap_or(store_default.max_tenants),
            merge_idle: duration(
                "merge_idle",
                args.merge_idle.or(file.merge_idle),
                store_default.merge_idle,
            )?,
            parent_wait_flushes: args
                .parent_wait_flushes
                .or(file.parent_wait_flushes)
                .unwrap_or(store_default.parent_wait_flushes),
            compression: compression(args.compression.or(file.compression))?,
            skip_corrupt_blocks: args.skip_corrupt_blocks
                || file.skip_corrupt_blocks.unwrap_or(false),
            retention: retention::retention(
                RetentionKeys {
                    retention: args.retention,
                    spans_retention: args.spans_retention,
                    logs_retention: args.logs_retention,
                    metrics_retention: args.metrics_retention,
                    redaction: None,
                }
                .or(RetentionKeys {
                    retention: file.retention,
                    spans_retention: file.spans_retention,
                    logs_retention: file.logs_retention,
                    metrics_retention: file.metrics_retention,
                    redaction: None,
                }),
                &file.tenants,
            )?,
            ..store_default
        };
        // half of the heads' budget may be held decoded (a busy tenant's head in full, most of
        // the time, so that its flush decodes nothing); the rest is held encoded
        store.decoded_head_bytes = store.max_head_bytes / 2;
        if store.window < Duration::from_secs(60) {
            return Err(ConfigError::Invalid {
                key: "block_window",
                detail: "must be at least 1m".into(),
            });
        }
        if store.max_pending_rows < store.flush_rows {
            return Err(ConfigError::Invalid {
                key: "max_pending_rows",
                detail: "must be at least flush_rows".into(),
            });
        }
        let sql_default = SqlConfig::default();
        let sql = SqlConfig {
            memory_limit: positive(
                "sql_memory_limit",
                args.sql_memory_limit
                    .or(file.sql_memory_limit)
                    .unwrap_or(sql_default.memory_limit),
            )?,
            timeout: duration(
                "sql_timeout",
                args.sql_timeout.or(file.sql_timeout),
                sql_default.timeout,
            )?,
            plan_cache: args
                .sql_plan_cache
                .or(file.sql_plan_cache)
                .unwrap_or(sql_default.plan_cache),
            context_windows: file.context_windows.clone(),
            max_concurrent: positive(
                "sql_max_concurrent",
                args.sql_max_concurrent
                    .or(file.sql_max_concurrent)
                    .unwrap_or(sql_default.max_concurrent),
            )?,
            queue_wait: duration(
                "sql_queue_wait",
                args.sql_queue_wait.or(file.sql_queue_wait),
                sql_default.queue_wait,
            )?,
            ..sql_default
        };
        let pg_max_connections = positive(
            "pg_max_connections",
            args.pg_max_connections
                .or(file.pg_max_connections)
                .unwrap_or(256),
        )?;
        if sql.timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "sql_timeout",
                detail: "must be greater than 0".into(),
            });
        }
        let redaction = redaction::policy(
            RedactionKeys {
                capture_content: args.capture_content,
                redact_pii: args.redact_pii,
                ..Default::default()
            }
            .or(file.redaction.unwrap_or_default()),
            &file.tenants,
        )?;
        let span_metrics_interval = duration(
            "span_metrics_interval",
            args.span_metrics_interval.or(file.span_metrics_interval),
            Duration::from_secs(15),
        )?;
        let gpu_interval = duration(
            "gpu_interval",
            args.gpu_interval.or(file.gpu_interval),
            Duration::from_secs(10),
        )?;
        if gpu_interval.is_zero() {
            return Err(ConfigError::Invalid {
                key: "gpu_interval",
                detail: "must be greater than 0".into(),
            });
        }
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
            args.tls_client_ca.or(file.tls_client_ca),
        ) {
            (Some(cert), Some(key), client_ca) => Some(crate::tls::TlsPaths {
                cert,
                key,
                client_ca,
            }),
            (None, None, None) => None,
            (Some(_), None, _) => {
                return Err(ConfigError::Invalid {
                    key: "tls_key",
                    detail: "--tls-cert needs --tls-key (the certificate's PEM private key)".into(),
                });
            }
            (None, Some(_), _) => {
                return Err(ConfigError::Invalid {
                    key: "tls_cert",
                    detail: "--tls-key needs --tls-cert (the PEM certificate chain)".into(),
                });
            }
            (None, None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: "tls_client_ca",
                    detail: "client certificates need TLS: give --tls-cert and --tls-key too"
                        .into(),
                });
            }
        };
        Ok(Self {
            tls,
            auth_file: args.auth_file.or(file.auth_file),
            insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
            gpu: args.gpu || file.gpu.unwrap_or(false),
            gpu_interval,
            span_metrics_interval,
            redaction,
            pg_listen: addr(
                "pg_listen",
                args.pg_listen.or(file.pg_listen),
                "127.0.0.1:5433",
            )?,
            pg_max_connections,
            max_trace_spans: args
                .max_trace_spans
                .or(file.max_trace_spans)
                .unwrap_or(100_000),
            pg_password: args
                .pg_password
                .or(file.pg_password)
                .filter(|p| !p.is_empty()),
            sql,
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./weft-data")),
            otlp_grpc_listen: addr(
                "otlp_grpc_listen",
                args.otlp_grpc_listen.or(file.otlp_grpc_listen),
                "127.0.0.1:4317",
            )?,
            otlp_http_listen: addr(
                "otlp_http_listen",
                args.otlp_http_listen.or(file.otlp_http_listen),
                "127.0.0.1:4318",
            )?,
            http_listen: addr(
                "http_listen",
                args.http_listen.or(file.http_listen),
                "127.0.0.1:3200",
            )?,
            limits,
            store,
            log: args.log.or(file.log).unwrap_or_else(|| "info".into()),
        })
    }

    fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source: Box::new(source),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_storage::model::TenantId;

    #[test]
    fn defaults_are_the_embedded_default() {
        let c = Config::load(ServeArgs::default()).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("./weft-data"));
        assert_eq!(c.http_listen.to_string(), "127.0.0.1:3200");
        assert_eq!(c.otlp_grpc_listen.port(), 4317);
        assert_eq!(c.otlp_http_listen.port(), 4318);
    }

    #[test]
    fn the_shipped_example_config_loads_and_flags_win() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../weft.example.toml");
        let args = ServeArgs {
            config: Some(path.clone()),
            http_listen: Some("127.0.0.1:9999".into()),
            ..Default::default()
        };
        let c = Config::load(args).unwrap();
        assert_eq!(c.http_listen.port(), 9999);
        let file_only = Config::load(ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(file_only.http_listen.port(), 3200);
        assert_eq!(file_only.store.flush_age, Duration::from_secs(10));
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = Config::load(ServeArgs {
            http_listen: Some("localhost".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("http_listen:"), "{e}");
        let e = Config::load(ServeArgs {
            flush_age: Some("soon".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("flush_age:"), "{e}");
    }

    #[test]
    fn retention_per_tenant_and_signal_from_the_file_and_flags() {
        use weft_storage::Signal;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weft.toml");
        std::fs::write(
            &path,
            "retention = \"30d\"\nlogs_retention = \"7d\"\n\
             [tenants.acme]\nretention = \"90d\"\nlogs_retention = \"1d\"\n\
             [tenants.free]\nspans_retention = \"12h\"\n",
        )
        .unwrap();
        let c = Config::load(ServeArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let r = &c.store.retention;
        let day = Duration::from_secs(86_400);
        let t = |n: &str| TenantId::new(n).unwrap();
        assert_eq!(r.of(&t("other"), Signal::Spans), Some(30 * day));
        assert_eq!(r.of(&t("other"), Signal::Logs), Some(7 * day));
        assert_eq!(r.of(&t("acme"), Signal::Spans), Some(90 * day));
        assert_eq!(r.of(&t("acme"), Signal::Logs), Some(day));
        assert_eq!(r.of(&t("free"), Signal::Spans), Some(day / 2));
        assert_eq!(r.of(&t("free"), Signal::Logs), Some(7 * day));
        // the flag overrides the file's default; 0 keeps forever
        let c = Config::load(ServeArgs {
            config: Some(path.clone()),
            retention: Some("0".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.store.retention.of(&t("other"), Signal::Spans), None);
        std::fs::write(&path, "[tenants.acme]\nretention = \"soon\"\n").unwrap();
        let e = Config::load(ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("tenants.acme.retention"), "{e}");
    }
}
