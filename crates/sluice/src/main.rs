//! `sluice`: parse the command line, set up logging, run the command.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice::{oci_cmd, run, shutdown_signal};
use sluice_telemetry::LogFormat;
use tokio::net::TcpListener;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Held to the end: dropping it writes out the lines still buffered.
    let _logs = sluice_telemetry::logging::init(cli.log_format.unwrap_or_else(LogFormat::default_for_stderr));
    sluice_telemetry::metrics().set_build(env!("CARGO_PKG_VERSION"), env!("SLUICE_GIT_COMMIT"));
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
        Command::Run(args) => run::tokio_runtime(args.worker_threads)?.block_on(run::run(*args, shutdown_signal())),
        Command::Push(args) => tokio_runtime()?.block_on(oci_cmd::push(args)),
        Command::Pull(args) => tokio_runtime()?.block_on(oci_cmd::pull(args)),
        Command::Inspect(args) => tokio_runtime()?.block_on(oci_cmd::inspect(args)),
    }
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}
