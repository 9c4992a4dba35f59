//! `sluice`: parse the command line, set up logging, run the command.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice::{oci_cmd, run, shutdown_signal};
use sluice_telemetry::LogFormat;
use tokio::net::TcpListener;

// musl's malloc serialises every thread on one lock; the static build (the
// container image) allocates through mimalloc instead.
#[cfg(target_env = "musl")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "sluice", version, about = "An AI gateway whose policies are WebAssembly plugins")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// `json` or `text` [default: json, or text when stderr is a terminal].
    #[arg(long, global = true, env = "SLUICE_LOG_FORMAT")]
    log_format: Option<sluice_telemetry::LogFormat>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway on GatewayPlugin and AIModelRoute YAML from a
    /// directory (`--config`), or from the Kubernetes API (`--kubernetes`).
    Run(Box<run::RunArgs>),
    /// Run an OpenAI-compatible upstream that echoes what it receives.
    EchoUpstream {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        /// Pause between streamed chunks.
        #[arg(long, default_value_t = 30)]
        chunk_delay_ms: u64,
    },
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Push a plugin component to an OCI registry (CNCF Wasm layout).
    Push(oci_cmd::PushArgs),
    /// Pull a plugin component from an OCI registry, verified.
    Pull(oci_cmd::PullArgs),
    /// Describe a plugin artifact in an OCI registry.
    Inspect(oci_cmd::InspectArgs),
    /// Start a plugin project of your own.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Sign a plugin already in an OCI registry with a cosign key.
    Sign(oci_cmd::SignArgs),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Write a standalone plugin project: the plugin, its build, a local
    /// test against the echo upstream, a GatewayPlugin, and the WIT.
    New(sluice::plugin_new::NewArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Held to the end: dropping it writes out the lines still buffered.
    let _logs = sluice_telemetry::logging::init(cli.log_format.unwrap_or_else(LogFormat::default_for_stderr));
    match command(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The cause chain, not anyhow's `Debug`: with RUST_BACKTRACE set
            // that symbolises a backtrace from the binary's line tables,
            // which took a failed `sluice pull` from 8 to 100+ MiB of RSS
            // and tells a user nothing about a refused or missing artifact.
            // Panics still print their backtrace.
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn command(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds => {
            print!("{}", sluice_api::crds_yaml());
            Ok(())
        }
        Command::EchoUpstream { listen, chunk_delay_ms } => tokio_runtime()?.block_on(async {
            let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
            tracing::info!(%listen, "echo upstream listening");
            let options =
                sluice_echo::EchoOptions { chunk_delay: Duration::from_millis(chunk_delay_ms), ..Default::default() };
            sluice_echo::serve(listener, options, shutdown_signal()).await?;
            Ok(())
        }),
        Command::Run(args) => {
            sluice_telemetry::metrics().set_build(env!("CARGO_PKG_VERSION"), env!("SLUICE_GIT_COMMIT"));
            run::tokio_runtime(args.worker_threads)?.block_on(run::run(*args, shutdown_signal()))
        }
        Command::Push(args) => cli_runtime()?.block_on(oci_cmd::push(args)),
        Command::Pull(args) => cli_runtime()?.block_on(oci_cmd::pull(args)),
        Command::Inspect(args) => cli_runtime()?.block_on(oci_cmd::inspect(args)),
        Command::Plugin(PluginCommand::New(args)) => sluice::plugin_new::run(args),
        Command::Sign(args) => cli_runtime()?.block_on(oci_cmd::sign(args)),
    }
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// One thread for a command that talks to one registry: no worker threads
/// (each with its own stack and malloc arena) to start for a single request
/// at a time.
fn cli_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}
