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
    /// Run the gateway on GatewayPlugin and AIModelRoute YAML from a
    /// directory (`--config`), or from the Kubernetes API (`--kubernetes`).
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
    #[arg(long, required_unless_present = "kubernetes", conflicts_with = "kubernetes")]
    config: Option<PathBuf>,
    /// Read GatewayPlugins and AIModelRoutes from the Kubernetes API, and
    /// write their status. Uses the in-cluster config, or `--kubeconfig`,
    /// or `KUBECONFIG`/`~/.kube/config`.
    #[arg(long)]
    kubernetes: bool,
    #[arg(long, requires = "kubernetes", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Watch this namespace only (the least privilege: a Role there is
    /// enough). All namespaces when not given.
    #[arg(long, requires = "kubernetes", env = "SLUICE_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Namespace of the leader Lease and of the replicas' report Leases.
    #[arg(long, requires = "kubernetes", env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's identity in load reports and Events (the pod name).
    #[arg(long, requires = "kubernetes", env = "POD_NAME")]
    replica_name: Option<String>,
    /// On shutdown, how long to keep accepting requests with /readyz
    /// failing, so load balancers stop routing here first.
    #[arg(long, default_value_t = 0)]
    shutdown_delay_seconds: u64,
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
    let settings = Settings {
        max_body_bytes: args.max_body_bytes,
        oci_resync: Duration::from_secs(args.oci_resync_seconds.max(1)),
    };
    let gateway = Gateway::new(runtime, Some(registry), settings)?;

    let data = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let admin = TcpListener::bind(args.admin).await.with_context(|| format!("binding {}", args.admin))?;
    let (updates_tx, updates_rx) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut controller = None;
    match &args.config {
        Some(config) => {
            tracing::info!(listen = %args.listen, admin = %args.admin, config = %config.display(), "sluice starting");
            tokio::spawn(FileSource::new(config).run(updates_tx));
        }
        None => {
            let client = kube_client(args.kubeconfig.as_deref()).await?;
            let options = sluice_controller::Options {
                namespace: args.watch_namespace.clone(),
                lease_namespace: args.lease_namespace.clone(),
                replica: args.replica_name.clone().unwrap_or_else(hostname),
            };
            tracing::info!(listen = %args.listen, admin = %args.admin, namespace = options.namespace.as_deref().unwrap_or("(all)"), replica = %options.replica, "sluice starting on Kubernetes");
            let reports = gateway.load_reports();
            controller = Some(tokio::spawn(sluice_controller::run(
                client,
                options,
                updates_tx,
                reports,
                stopped(stop_rx.clone()),
            )));
        }
    }
    let following = gateway.clone();
    tokio::spawn(async move {
        let _ = warm_up.await;
        following.follow(updates_rx).await;
    });

    let admin_task = tokio::spawn(sluice_gateway::serve_admin(gateway.clone(), admin, stopped(stop_rx.clone())));
    let draining = gateway.clone();
    let shutdown_delay = Duration::from_secs(args.shutdown_delay_seconds);
    let data_plane = sluice_gateway::serve_data_plane(
        gateway,
        data,
        async move {
            shutdown_signal().await;
            draining.begin_drain();
            if !shutdown_delay.is_zero() {
                tracing::info!(delay = ?shutdown_delay, "shutting down: not ready, still serving");
                tokio::time::sleep(shutdown_delay).await;
            }
            tracing::info!("shutting down: draining in-flight requests");
            let _ = stop_tx.send(true);
        },
        Duration::from_secs(args.drain_seconds),
    );
    data_plane.await;
    let _ = admin_task.await;
    if let Some(controller) = controller {
        // Hands the lead over and withdraws this replica's report.
        let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    }
    tracing::info!("stopped");
    Ok(())
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await.context("finding the Kubernetes API (in-cluster or kubeconfig)")?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("sluice-{}", std::process::id()))
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
