//! The `weft` binary.

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;
use tracing_subscriber::EnvFilter;
use weft_api::config::{Config, ServeArgs};

/// Many small short-lived allocations (decoded spans, JSON answers) across threads: mimalloc
/// keeps per-thread free lists and returns memory to the OS in pages, which suits this pattern
/// better than glibc's malloc (chosen in a6e9598; no measurement of it is on record).
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (args, reindex) = match cli.command {
        Some(Command::Serve(args)) => (args, false),
        Some(Command::Reindex(args)) => (args, true),
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
