//! The `weft` binary.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use weft_api::config::{Config, ServeArgs};

/// Many small short-lived allocations (decoded spans, JSON answers) across threads: mimalloc
/// keeps per-thread free lists and returns memory to the OS in pages, which suits this pattern
/// better than glibc's malloc (measured in BENCHMARKS.md, twenty-eighth session). The
/// `system-allocator` feature leaves it out, for heap profilers that hook malloc.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weft: a trace database for LLM serving. Takes OTLP traces over gRPC (4317) and HTTP (4318),
/// stores them in a columnar RocksDB store, and answers queries on 3200.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the server (the default): OTLP receivers, storage and query API in one process.
    Serve(ServeArgs),
    /// Rebuild the full-text index of the logs from the stored records (the server stopped),
    /// with the same options as `serve` (`--data-dir`, …).
    Reindex(ServeArgs),
    /// Sample this host's NVIDIA GPUs through NVML and send the points (and XID events) to a
    /// Weft server over OTLP/HTTP; exits non-zero when no NVIDIA driver or library is found.
    GpuAgent(GpuAgentArgs),
    /// Verify a stopped store: checksums of every block value and head record, and RocksDB's own;
    /// lists what is damaged and exits 1 if anything is.
    Check {
        /// The data directory (`--data-dir` of `serve`).
        #[arg(long, env = "WEFT_DATA_DIR", default_value = "./weft-data")]
        data_dir: std::path::PathBuf,
    },
    /// Tokens for the auth file (`--auth-file`).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Print a fresh token, and the lines that add it to the auth file (which keeps only its
    /// SHA-256); send SIGHUP to a running server to read the file again.
    New {
        /// The tenant the token may read or write; `*` for every tenant (an admin token).
        #[arg(long)]
        tenant: String,
        /// What the token may do: read, write, or both.
        #[arg(long, value_delimiter = ',', default_value = "read,write")]
        scopes: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
struct GpuAgentArgs {
    /// The Weft server's OTLP/HTTP address.
    #[arg(long, env = "WEFT_GPU_TARGET", default_value = "http://127.0.0.1:4318")]
    target: String,
    /// How often to sample, e.g. 10s.
    #[arg(long, env = "WEFT_GPU_INTERVAL", default_value = "10s")]
    gpu_interval: String,
    /// The tenant to write as (X-Scope-OrgID).
    #[arg(long, env = "WEFT_TENANT")]
    tenant: Option<String>,
    /// Stop after this many samples (default: run until stopped).
    #[arg(long)]
    samples: Option<u64>,
}

fn gpu_agent(args: GpuAgentArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("WEFT_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let every = weft_api::time::parse_duration(&args.gpu_interval)
        .map_err(|e| anyhow::anyhow!("--gpu-interval: {e}"))?;
    anyhow::ensure!(!every.is_zero(), "--gpu-interval must be greater than 0");
    let gpus = weft_ingest::gpu::nvml::NvmlGpus::open()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(weft_api::gpu::agent(
        Box::new(gpus),
        &args.target,
        args.tenant.as_deref(),
        every,
        args.samples,
    ))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (args, reindex) = match cli.command {
        Some(Command::Serve(args)) => (args, false),
        Some(Command::Reindex(args)) => (args, true),
        Some(Command::GpuAgent(args)) => return gpu_agent(args),
        Some(Command::Check { data_dir }) => {
            let report = weft_storage::store::check(&data_dir)
                .map_err(|e| anyhow::anyhow!("cannot check {}: {e}", data_dir.display()))?;
            println!("{report}");
            std::process::exit(if report.damaged.is_empty() { 0 } else { 1 });
        }
        Some(Command::Token(TokenCommand::New { tenant, scopes })) => {
            let (token, lines) =
                weft_api::auth::new_token(&tenant, &scopes).map_err(anyhow::Error::msg)?;
            println!("token: {token}\n\n# add to the auth file:\n{lines}");
            return Ok(());
        }
        None => (ServeArgs::parse_from_env(), false),
    };
    let config = Config::load(args)?;
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&config.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    if reindex {
        let windows = weft_storage::Store::rebuild_text(&config.data_dir, config.store.clone())?;
        println!("text index rebuilt: {windows} windows");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(weft_api::server::run(config))?;
    Ok(())
}

trait FromEnv {
    fn parse_from_env() -> Self;
}

impl FromEnv for ServeArgs {
    /// `weft` with no subcommand: serve, configured by `WEFT_*` variables only.
    fn parse_from_env() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            args: ServeArgs,
        }
        Only::parse_from(["weft"]).args
    }
}
