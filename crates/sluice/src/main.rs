//! `sluice`: parse the command line, build, run, drain on shutdown.

mod oci_cmd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice_gateway::{ConfigSource, FileSource, Gateway, Settings};
use sluice_runtime::{Runtime, RuntimeConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Parser)]
#[command(name = "sluice", version, about = "An AI gateway whose policies are WebAssembly plugins")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway on GatewayPlugin and AIModelRoute YAML from a directory.
    Run(RunArgs),
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

#[derive(clap::Args)]
struct RunArgs {
    /// Directory of GatewayPlugin and AIModelRoute YAML, watched for changes.
    #[arg(long)]
    config: PathBuf,
    /// Data plane (OpenAI API) address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Admin address: /healthz, /readyz, /admin/config.
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// Where compiled plugins are cached across restarts.
    #[arg(long, env = "SLUICE_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = Settings::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Plugin instances alive at once, across all requests.
    #[arg(long, default_value_t = RuntimeConfig::default().max_instances)]
    max_plugin_instances: u32,
    /// On shutdown, how long in-flight requests (streams included) may take to finish.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    /// How often plugins from OCI tags with `pullPolicy: Always` are resolved again.
    #[arg(long, default_value_t = Settings::default().oci_resync.as_secs())]
    oci_resync_seconds: u64,
    #[command(flatten)]
    registry: oci_cmd::RegistryArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in files or pod logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
        Command::Run(args) => tokio_runtime()?.block_on(run(args)),
        Command::Push(args) => tokio_runtime()?.block_on(oci_cmd::push(args)),
        Command::Pull(args) => tokio_runtime()?.block_on(oci_cmd::pull(args)),
        Command::Inspect(args) => tokio_runtime()?.block_on(oci_cmd::inspect(args)),
    }
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let cache_dir = args.cache_dir.or_else(default_cache_dir);
    let runtime =
        Runtime::new(RuntimeConfig { cache_dir, max_instances: args.max_plugin_instances, ..Default::default() })
            .context("starting the plugin runtime")?;
    // Loading the BPE tables takes a moment: it is done before the first
    // config is applied (and so before /readyz), or a plugin's first
    // `count-tokens` call would spend its deadline on it.
    let warm_up = tokio::task::spawn_blocking(sluice_runtime::tokens::warm_up);
    let registry = args.registry.registry().context("setting up the OCI registry client")?;
    let settings =
        Settings { max_body_bytes: args.max_body_bytes, oci_resync: Duration::from_secs(args.oci_resync_seconds.max(1)) };
    let gateway = Gateway::new(runtime, Some(registry), settings)?;

    let data = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let admin = TcpListener::bind(args.admin).await.with_context(|| format!("binding {}", args.admin))?;
    tracing::info!(listen = %args.listen, admin = %args.admin, config = %args.config.display(), "sluice starting");

    let (updates_tx, updates_rx) = watch::channel(None);
    tokio::spawn(FileSource::new(&args.config).run(updates_tx));
    let following = gateway.clone();
    tokio::spawn(async move {
        let _ = warm_up.await;
        following.follow(updates_rx).await;
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let admin_task = tokio::spawn(sluice_gateway::serve_admin(gateway.clone(), admin, stopped(stop_rx.clone())));
    let data_plane = sluice_gateway::serve_data_plane(
        gateway,
        data,
        async move {
            shutdown_signal().await;
            tracing::info!("shutting down: draining in-flight requests");
            let _ = stop_tx.send(true);
        },
        Duration::from_secs(args.drain_seconds),
    );
    data_plane.await;
    let _ = admin_task.await;
    tracing::info!("stopped");
    Ok(())
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("sluice").join("compiled"))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
