//! `sluice run`: build the runtime, the gateway and the config source, serve
//! until shutdown, then drain.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_core::McpLimits;
use sluice_gateway::{Gateway, Settings};
use sluice_runtime::{Runtime, RuntimeConfig};
use sluice_serve::Limits;
use sluice_standalone::FileSource;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::oci_cmd::RegistryArgs;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Directory of GatewayPlugin and AIModelRoute YAML, watched for changes.
    #[arg(long, required_unless_present = "kubernetes", conflicts_with = "kubernetes")]
    pub config: Option<PathBuf>,
    /// Read GatewayPlugins and AIModelRoutes from the Kubernetes API, and
    /// write their status. Uses the in-cluster config, or `--kubeconfig`,
    /// or `KUBECONFIG`/`~/.kube/config`.
    #[arg(long)]
    pub kubernetes: bool,
    #[arg(long, requires = "kubernetes", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Watch this namespace only (the least privilege: a Role there is
    /// enough). All namespaces when not given.
    #[arg(long, requires = "kubernetes", env = "SLUICE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Namespace of the leader Lease and of the replicas' report Leases.
    #[arg(long, requires = "kubernetes", env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in load reports and Events (the pod name).
    #[arg(long, requires = "kubernetes", env = "POD_NAME")]
    pub replica_name: Option<String>,
    /// A directory whose files GatewayPlugins (`source.file`) and
    /// AIModelRoutes (`apiKeyFile`) may name: a volume mounted for them.
    /// Repeatable. None by default: a resource could otherwise have any file
    /// the gateway can read (its ServiceAccount token) sent to a backend of
    /// its choosing.
    #[arg(
        long,
        conflicts_with = "config",
        value_name = "DIR",
        env = "SLUICE_ALLOW_HOST_FILES_UNDER",
        value_delimiter = ','
    )]
    pub allow_host_files_under: Vec<PathBuf>,
    /// An environment variable of the gateway that AIModelRoutes may name
    /// in `apiKeyEnv`. Repeatable. None by default.
    #[arg(long, conflicts_with = "config", value_name = "NAME", env = "SLUICE_ALLOW_HOST_ENV", value_delimiter = ',')]
    pub allow_host_env: Vec<String>,
    /// NAMESPACE=PATTERN: AIModelRoutes in NAMESPACE may claim the models
    /// PATTERN matches (a model name, or a prefix followed by `*`); the most
    /// specific pattern matching a model decides. Repeatable. By default the
    /// gateway's own namespace (--watch-namespace, else --lease-namespace)
    /// claims every model and no other namespace any.
    #[arg(
        long,
        conflicts_with = "config",
        value_name = "NAMESPACE=PATTERN",
        env = "SLUICE_MODEL_CLAIMS",
        value_delimiter = ','
    )]
    pub model_claim: Vec<sluice_controller::ModelClaim>,
    /// NAMESPACE=PREFIX: MCPRoutes in NAMESPACE may claim the paths PREFIX
    /// matches: itself and the paths below it at a segment boundary
    /// (`/mcp/team-a` matches `/mcp/team-a/x`, not `/mcp/team-ab`), or `*`
    /// for every path; the longest prefix matching a path decides.
    /// Repeatable. By default the gateway's own namespace (--watch-namespace,
    /// else --lease-namespace) claims every path and no other namespace any.
    #[arg(
        long,
        conflicts_with = "config",
        value_name = "NAMESPACE=PREFIX",
        env = "SLUICE_MCP_PATH_CLAIMS",
        value_delimiter = ','
    )]
    pub mcp_path_claim: Vec<sluice_controller::McpPathClaim>,
    /// A namespace whose GatewayPlugins, when they name no pull Secret, may
    /// pull with the registry credentials given to the gateway
    /// (--docker-config, --credentials-file); the others pull anonymously.
    /// Repeatable. By default the gateway's own namespace only.
    #[arg(
        long,
        conflicts_with = "config",
        value_name = "NAMESPACE",
        env = "SLUICE_REGISTRY_CREDENTIALS_NAMESPACES",
        value_delimiter = ','
    )]
    pub registry_credentials_namespace: Vec<String>,
    /// On shutdown, how long to keep accepting requests with /readyz
    /// failing, so load balancers stop routing here first.
    #[arg(long, default_value_t = 0)]
    pub shutdown_delay_seconds: u64,
    /// Data plane (OpenAI API) address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin address: /healthz, /readyz, /metrics, /admin/config. The config view
    /// tells what is routed where: keep it on loopback (the default) and
    /// give probes their own listener with --probes.
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: SocketAddr,
    /// Threads that serve requests; 0 means one per CPU this process may
    /// use (its affinity and cgroup quota). With one, the gateway runs on a
    /// single-threaded runtime, which costs less per request than a
    /// work-stealing pool of one.
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Also serve /healthz and /readyz (and nothing else) here: the address
    /// the kubelet probes, e.g. 0.0.0.0:9902.
    #[arg(long, value_name = "ADDR")]
    pub probes: Option<SocketAddr>,
    /// Where compiled plugins are cached across restarts
    /// [default: $XDG_CACHE_HOME/sluice/compiled].
    #[arg(long, env = "SLUICE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = Settings::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Plugin instances alive at once, across all requests.
    #[arg(long, default_value_t = RuntimeConfig::default().max_instances)]
    pub max_plugin_instances: u32,
    /// Linear memory all plugin instances may hold together, in bytes; past
    /// it, a request that needs another instance gets a 503. The default
    /// fits a 1 GiB container next to the request-body budget.
    #[arg(long, default_value_t = RuntimeConfig::default().max_guest_memory_bytes)]
    pub max_guest_memory_bytes: usize,
    /// Instances of one plugin version alive at once; past it, a 503.
    #[arg(long, default_value_t = RuntimeConfig::default().max_instances_per_plugin)]
    pub max_instances_per_plugin: u32,
    /// Threads that count tokens for plugins, off the async workers.
    #[arg(long, default_value_t = RuntimeConfig::default().token_counting_threads)]
    pub token_counting_threads: usize,
    /// Log lines each plugin may write per second; the rest are dropped
    /// and counted.
    #[arg(long, default_value_t = RuntimeConfig::default().plugin_log_lines_per_second)]
    pub plugin_log_lines_per_second: u32,
    /// Bytes all plugin snapshots may hold together (each plugin version is
    /// snapshotted after `configure`, so instances skip it); past it, new
    /// versions are configured per instance. 0 turns snapshots off.
    #[arg(long, default_value_t = RuntimeConfig::default().max_snapshot_bytes)]
    pub max_snapshot_bytes: usize,
    /// Milliseconds a new `PerRequest` plugin version serves, configured per
    /// instance, before its snapshot is made: versions replaced sooner cost
    /// no compile.
    #[arg(long, default_value_t = RuntimeConfig::default().snapshot_settle.as_millis() as u64)]
    pub plugin_snapshot_settle_ms: u64,
    /// Milliseconds a plugin version's new instances may spend in
    /// `configure`, for want of a snapshot, before it is made (settled or
    /// not; a `Reused` version's only then).
    #[arg(long, default_value_t = RuntimeConfig::default().snapshot_configure_budget.as_millis() as u64)]
    pub plugin_snapshot_configure_budget_ms: u64,
    /// Bytes of each plugin memory a finished instance leaves resident for
    /// the next one (Linux 6.7+ only). 0 turns it off.
    #[arg(long, default_value_t = RuntimeConfig::default().keep_resident_bytes)]
    pub plugin_keep_resident_bytes: usize,
    /// Restore a `PerRequest` plugin instance to how it was made after each
    /// request, for the next one, instead of making a new instance per
    /// request (the same isolation, cheaper). `false` makes new ones.
    #[arg(long, default_value_t = RuntimeConfig::default().restore_instances, action = clap::ArgAction::Set)]
    pub plugin_restore_instances: bool,
    /// Loading one plugin (pull, compile, configure) may take this long;
    /// past it, it is reported and retried, and the rest of the config is
    /// applied without it.
    #[arg(long, default_value_t = Settings::default().plugin_load_timeout.as_secs())]
    pub plugin_load_timeout_seconds: u64,
    /// An upstream that sends nothing for this long mid-body is cut off.
    #[arg(long, default_value_t = Settings::default().upstream_idle_timeout.as_secs())]
    pub upstream_idle_timeout_seconds: u64,
    /// On shutdown, how long in-flight requests (streams included) may take to finish.
    #[arg(long, default_value_t = 30)]
    pub drain_seconds: u64,
    /// How often plugins from OCI tags with `pullPolicy: Always` are resolved again.
    #[arg(long, default_value_t = Settings::default().oci_resync.as_secs())]
    pub oci_resync_seconds: u64,
    /// Longest a starting replica stays not ready while a declared plugin's
    /// registry is unreachable; then it serves without that plugin.
    #[arg(long, default_value_t = Settings::default().max_ready_wait.as_secs())]
    pub max_ready_wait_seconds: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub fairness: FairnessArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    #[command(flatten)]
    pub backends: BackendArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub egress: EgressArgs,
    #[command(flatten)]
    pub mcp: McpArgs,
}

/// MCP routes (MCPRoute).
#[derive(clap::Args)]
#[command(next_help_heading = "MCP")]
pub struct McpArgs {
    /// A file of keys that seal MCP session ids, one per line (32 bytes,
    /// base64 or hex): the first seals, every one opens, so keys rotate
    /// without ending sessions. Give every replica the same file (a
    /// mounted Secret) and any replica continues any session, across
    /// restarts. Without it a key is made up at start: sessions then end
    /// with the process and stay on the replica that began them.
    #[arg(long, value_name = "FILE", env = "SLUICE_MCP_SESSION_KEYS")]
    pub mcp_session_keys: Option<std::path::PathBuf>,
    /// The largest JSON-RPC message an MCP route may accept, either way
    /// (a route's `limits.maxMessageBytes` may only lower it; the request
    /// body limit applies too).
    #[arg(long, default_value_t = McpLimits::default().max_message_bytes)]
    pub mcp_max_message_bytes: usize,
    /// The most items an MCP route's merged listing may hold.
    #[arg(long, default_value_t = McpLimits::default().max_tools)]
    pub mcp_max_tools: usize,
    /// The most streams an MCP session may hold open on one replica.
    #[arg(long, default_value_t = McpLimits::default().max_streams_per_session)]
    pub mcp_max_streams_per_session: usize,
    /// The longest an MCP server's stream may stay silent before it is cut.
    #[arg(long, default_value_t = McpLimits::default().stream_idle_timeout.as_secs())]
    pub mcp_max_stream_idle_seconds: u64,
    /// The longest an MCP session id is honoured after it was minted.
    #[arg(long, default_value_t = McpLimits::default().session_ttl.as_secs())]
    pub mcp_max_session_ttl_seconds: u64,
}

impl McpArgs {
    fn limits(&self) -> McpLimits {
        McpLimits {
            max_message_bytes: self.mcp_max_message_bytes,
            max_tools: self.mcp_max_tools.max(1),
            max_streams_per_session: self.mcp_max_streams_per_session.max(1),
            stream_idle_timeout: Duration::from_secs(self.mcp_max_stream_idle_seconds.max(1)),
            session_ttl: Duration::from_secs(self.mcp_max_session_ttl_seconds.max(1)),
        }
    }
}

/// Outbound HTTP of plugins granted it (`spec.egress`): the caps every
/// grant is held to, and may only lower. Which addresses a grant may name
/// follows the backends' rules (`--restrict-backends`, `--allow-backend-cidr`).
#[derive(clap::Args)]
#[command(next_help_heading = "Plugin outbound HTTP")]
pub struct EgressArgs {
    /// The largest response body a plugin's outbound call may read, in bytes.
    #[arg(long, default_value_t = sluice_runtime::EgressConfig::default().max_response_bytes)]
    pub egress_max_response_bytes: u64,
    /// Outbound calls one plugin may have in flight at once (over all its
    /// instances); one more is refused at once.
    #[arg(long, default_value_t = sluice_runtime::EgressConfig::default().max_concurrent_calls)]
    pub egress_max_concurrent_calls: u32,
}

/// The shared state plugins granted it (`spec.state`) keep: in this
/// process, per replica. Each plugin's keys are its own; these cap what one
/// plugin may hold, and a grant may only lower them.
#[derive(clap::Args)]
#[command(next_help_heading = "Plugin state")]
pub struct StateArgs {
    /// The longest key a plugin may name, in bytes.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_key_bytes)]
    pub state_max_key_bytes: usize,
    /// The largest value a plugin may store under one key, in bytes.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_value_bytes)]
    pub state_max_value_bytes: usize,
    /// Keys (counters, one per window, and entries) one plugin may hold.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_keys_per_plugin)]
    pub state_max_keys_per_plugin: usize,
    /// Bytes of keys and values one plugin may hold.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_bytes_per_plugin)]
    pub state_max_bytes_per_plugin: usize,
    /// Bytes of keys and values all plugins may hold together.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_bytes_total)]
    pub state_max_bytes: usize,
    /// Keys all plugins may hold together (each costs the store up to about
    /// 120 bytes beyond its key and value).
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().max_keys_total)]
    pub state_max_keys: usize,
    /// The share of --state-max-bytes and --state-max-keys one namespace's
    /// plugins may hold together, in percent; past it, their calls that
    /// would add are refused, and other namespaces keep their room.
    #[arg(long, default_value_t = sluice_runtime::sluice_state::Limits::default().namespace_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub state_max_bytes_namespace_percent: u8,
    /// Keep plugins' state in this Redis (`redis://HOST:PORT[/DB]`, or
    /// `rediss://` for TLS), shared by every replica, instead of in this
    /// process. A Redis that is down does not stop the gateway: plugins'
    /// state calls fail as unavailable (their failure policy decides) until
    /// it answers. Sentinel and Cluster: docs/plugin-interface.md.
    #[arg(long, value_name = "URL", env = "SLUICE_STATE_REDIS_URL")]
    pub state_redis_url: Option<String>,
    /// The Redis ACL user, if not `default`.
    #[arg(long, value_name = "USER", env = "SLUICE_STATE_REDIS_USERNAME")]
    pub state_redis_username: Option<String>,
    /// A file holding the Redis password (a mounted Secret); or set
    /// SLUICE_STATE_REDIS_PASSWORD. Never a flag: a flag's value shows in
    /// the process list.
    #[arg(long, value_name = "FILE")]
    pub state_redis_password_file: Option<PathBuf>,
    /// How long one Redis call may take before it is given up (it is
    /// bounded by the calling plugin's deadline too).
    #[arg(long, default_value_t = 500)]
    pub state_redis_timeout_ms: u64,
    /// For `rediss://`: the CA (PEM) that signed Redis's certificate, e.g.
    /// an in-cluster Redis's own, trusted instead of the webpki roots.
    #[arg(long, value_name = "FILE")]
    pub state_redis_ca_file: Option<PathBuf>,
    /// For `rediss://`: a client certificate (PEM) for a Redis that asks for
    /// one (`tls-auth-clients`), with --state-redis-client-key-file.
    #[arg(long, value_name = "FILE", requires = "state_redis_client_key_file")]
    pub state_redis_client_cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM; a mounted Secret).
    #[arg(long, value_name = "FILE", requires = "state_redis_client_cert_file")]
    pub state_redis_client_key_file: Option<PathBuf>,
}

impl StateArgs {
    fn limits(&self) -> sluice_runtime::sluice_state::Limits {
        sluice_runtime::sluice_state::Limits {
            max_key_bytes: self.state_max_key_bytes.max(1),
            max_value_bytes: self.state_max_value_bytes,
            max_keys_per_plugin: self.state_max_keys_per_plugin,
            max_bytes_per_plugin: self.state_max_bytes_per_plugin,
            max_bytes_total: self.state_max_bytes,
            max_keys_total: self.state_max_keys,
            namespace_percent: self.state_max_bytes_namespace_percent,
            ..Default::default()
        }
    }

    /// The Redis store, if one is named: only a URL that cannot be used, or
    /// a password file that cannot be read, stops the start.
    async fn redis(&self) -> anyhow::Result<Option<sluice_runtime::StateStore>> {
        use sluice_runtime::sluice_state::{RedisConfig, RedisStore, RedisTls};
        let Some(url) = &self.state_redis_url else { return Ok(None) };
        let password = match &self.state_redis_password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading --state-redis-password-file {}", path.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            None => std::env::var("SLUICE_STATE_REDIS_PASSWORD").ok(),
        };
        let read = |path: &Option<PathBuf>, flag: &str| -> anyhow::Result<Option<Vec<u8>>> {
            path.as_ref()
                .map(|path| std::fs::read(path).with_context(|| format!("reading --{flag} {}", path.display())))
                .transpose()
        };
        let tls = RedisTls {
            ca_pem: read(&self.state_redis_ca_file, "state-redis-ca-file")?,
            client_cert_pem: read(&self.state_redis_client_cert_file, "state-redis-client-cert-file")?,
            client_key_pem: read(&self.state_redis_client_key_file, "state-redis-client-key-file")?,
        };
        let config = RedisConfig {
            tls,
            username: self.state_redis_username.clone(),
            password,
            response_timeout: Duration::from_millis(self.state_redis_timeout_ms.max(1)),
            limits: self.limits(),
            ..RedisConfig::new(url.clone())
        };
        let store = RedisStore::connect(config).await.map_err(|e| anyhow::anyhow!("--state-redis-url: {e}"))?;
        Ok(Some(sluice_runtime::StateStore(Arc::new(store))))
    }
}

/// What routes' backends may reach, and request loops.
#[derive(clap::Args)]
#[command(next_help_heading = "Backends")]
pub struct BackendArgs {
    /// Refuse backends on loopback (127.0.0.0/8, ::1), 0.0.0.0/8,
    /// link-local (169.254.0.0/16, the cloud metadata service; fe80::/10),
    /// fd00:ec2::254, this host's own addresses, and the gateway's own
    /// listener ports, unless --allow-backend-cidr allows them. Always on
    /// with --kubernetes, where routes' authors are not the operator; off by
    /// default with --config.
    #[arg(long)]
    pub restrict_backends: bool,
    /// A range (ADDRESS/PREFIX, or one address) that restricted backends may
    /// reach after all, e.g. a sidecar on 127.0.0.1/32. Repeatable. The
    /// gateway's own listener ports stay refused.
    #[arg(long, value_name = "CIDR", env = "SLUICE_ALLOW_BACKEND_CIDR", value_delimiter = ',')]
    pub allow_backend_cidr: Vec<sluice_core::Cidr>,
    /// Sluice gateways (their `via` entries) a request may have passed
    /// through; past it, a 508. A request that comes back to the same
    /// gateway is refused whatever the count.
    #[arg(long, default_value_t = Settings::default().max_gateway_hops)]
    pub max_gateway_hops: usize,
}

/// Metrics, traces and the access log.
#[derive(clap::Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryArgs {
    /// Also serve /metrics (and nothing else) here, for Prometheus to
    /// scrape over the pod network, e.g. 0.0.0.0:9903. The admin listener
    /// serves /metrics too.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// One line per request at info, target `sluice::access`: ids, route,
    /// model, backend, status, timings, tokens and plugin outcomes; never
    /// prompt text or secrets.
    #[arg(long, env = "SLUICE_ACCESS_LOG", default_value_t = true, action = clap::ArgAction::Set)]
    pub access_log: bool,
    /// Distinct consumers (as auth plugins name them) metrics tell apart;
    /// the rest count as `other`.
    #[arg(long, default_value_t = 100)]
    pub metrics_max_consumers: usize,
    /// Distinct response models (as upstreams name them) metrics tell
    /// apart; the rest count as `other`.
    #[arg(long, default_value_t = 100)]
    pub metrics_max_response_models: usize,
    /// Send traces (a span per request, per plugin hook and per upstream
    /// attempt) and metrics (the ones /metrics serves) to this OTLP
    /// collector. Off by default; the standard `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// and `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` for one signal,
    /// also turn it on.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` [default: `OTEL_EXPORTER_OTLP_PROTOCOL`,
    /// else http/protobuf].
    #[arg(long)]
    pub otlp_protocol: Option<sluice_telemetry::trace::Protocol>,
    /// The share of requests traced, 0 to 1, unless the client's
    /// `traceparent` decides [default: `OTEL_TRACES_SAMPLER(_ARG)`, else 1].
    #[arg(long, value_name = "RATIO")]
    pub trace_sample_ratio: Option<f64>,
    /// How often metrics are pushed to the OTLP collector [default:
    /// `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds), else 60 seconds].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_metrics_interval_seconds: Option<u64>,
}

/// What one client, or many at once, may hold on the data plane. The admin
/// listener has fixed, smaller limits (64 connections, 10 s idle).
#[derive(clap::Args)]
#[command(next_help_heading = "Client limits")]
pub struct LimitArgs {
    /// Connections open at once; past it, new ones wait in the kernel's
    /// backlog until one closes.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// A connection with no request in flight is closed after this long,
    /// including one that never completes a request head.
    #[arg(long, default_value_t = Limits::default().idle_timeout.as_secs())]
    pub idle_timeout_seconds: u64,
    /// An HTTP/1 request head must arrive within this long (slowloris).
    #[arg(long, default_value_t = Limits::default().header_read_timeout.as_secs())]
    pub header_read_timeout_seconds: u64,
    /// A request body must arrive within this long; a 408 otherwise.
    #[arg(long, default_value_t = Settings::default().request_body_timeout.as_secs())]
    pub request_body_timeout_seconds: u64,
    /// Requests in flight at once, streams included; past it, a 503 in
    /// OpenAI's error shape.
    #[arg(long, default_value_t = Settings::default().max_in_flight)]
    pub max_in_flight_requests: usize,
    /// Memory all request bodies in flight may hold together, in bytes;
    /// past it, a 503.
    #[arg(long, default_value_t = Settings::default().max_buffered_body_bytes)]
    pub max_buffered_body_bytes: usize,
    /// Streams one HTTP/2 connection may have open at once.
    #[arg(long, default_value_t = Limits::default().http2_max_concurrent_streams)]
    pub http2_max_concurrent_streams: u32,
}

/// What one connection, or one peer address, may hold of what all clients
/// share, so that one client cannot lock the others out.
#[derive(clap::Args)]
#[command(next_help_heading = "Fairness between clients")]
pub struct FairnessArgs {
    /// A response the client does not take for this long (its window or
    /// socket stays full) closes its connection, and every stream on it.
    /// Time spent waiting on the upstream does not count. Applies to the
    /// data plane; the admin, probes and metrics listeners have a shorter
    /// one of their own.
    #[arg(long, default_value_t = Limits::default().write_timeout.as_secs())]
    pub write_timeout_seconds: u64,
    /// Requests in flight on one connection (HTTP/2 streams); past it, a
    /// 503 in OpenAI's error shape.
    #[arg(long, default_value_t = Settings::default().max_in_flight_per_connection)]
    pub max_in_flight_per_connection: usize,
    /// The share of --max-in-flight-requests, in percent (rounded up), that
    /// one peer address (an IPv6 /64) may hold; past it, a 503. Behind a
    /// proxy that hides client addresses, every client is one peer: raise
    /// it to 100 there.
    #[arg(long, default_value_t = Settings::default().max_in_flight_per_peer_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_in_flight_per_peer_percent: u8,
}

/// The tokio runtime `sluice run` serves on, `worker_threads` as its flag
/// says. Measured pinned to one core (tests/bench): a current-thread runtime
/// instead of a one-worker multi-thread one cut the CPU per request from 32
/// to 28.5 µs without plugins and from 128 to about 90 µs with two.
pub fn tokio_runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    // Named apart, so `ps -L` (and a test) tells which one runs.
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread().thread_name("sluice-blocking").enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sluice-worker")
            .enable_all()
            .build()
    }
}

/// Runs the gateway until `shutdown` resolves, then drains: /readyz fails
/// first, requests are still served for `--shutdown-delay-seconds`, then
/// in-flight requests get `--drain-seconds` to finish.
pub async fn run(args: RunArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let telemetry = &args.telemetry;
    let traces = sluice_telemetry::trace::init(sluice_telemetry::trace::TraceConfig {
        endpoint: telemetry.otlp_endpoint.clone(),
        protocol: telemetry.otlp_protocol,
        sample_ratio: telemetry.trace_sample_ratio,
    })
    .context("setting up tracing")?;
    // Before anything is counted: its time starts the cumulative series.
    let metrics_push = sluice_telemetry::otlp_metrics::init(sluice_telemetry::otlp_metrics::MetricsConfig {
        endpoint: telemetry.otlp_endpoint.clone(),
        protocol: telemetry.otlp_protocol,
        interval: telemetry.otlp_metrics_interval_seconds.map(Duration::from_secs),
    })
    .context("setting up OTLP metrics")?;
    let state_store = args.state.redis().await?;
    let gateway = build_gateway(&args, state_store)?;
    if let Some(push) = &metrics_push {
        let gateway = Arc::downgrade(&gateway);
        push.refresh_before_push(move || {
            if let Some(gateway) = gateway.upgrade() {
                sluice_gateway::refresh_metrics(&gateway);
            }
        });
    }
    sluice_telemetry::metrics().set_caps(telemetry.metrics_max_consumers, telemetry.metrics_max_response_models);
    if telemetry.access_log {
        sluice_telemetry::logging::enable_access_log();
    }
    let data = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let admin = TcpListener::bind(args.admin).await.with_context(|| format!("binding {}", args.admin))?;
    let probes = match args.probes {
        Some(addr) => Some(TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?),
        None => None,
    };
    let metrics = match telemetry.metrics {
        Some(addr) => Some(TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?),
        None => None,
    };

    let (updates_tx, updates_rx) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let controller = start_config_source(&args, &gateway, updates_tx, stop_rx.clone()).await?;
    tokio::spawn(gateway.clone().follow(updates_rx));

    let admin_task = tokio::spawn(sluice_gateway::serve_admin(gateway.clone(), admin, stopped(stop_rx.clone())));
    if let Some(probes) = probes {
        tokio::spawn(sluice_gateway::serve_probes(gateway.clone(), probes, stopped(stop_rx.clone())));
    }
    if let Some(metrics) = metrics {
        tokio::spawn(sluice_gateway::serve_metrics(gateway.clone(), metrics, stopped(stop_rx)));
    }
    let draining = gateway.clone();
    let shutdown_delay = Duration::from_secs(args.shutdown_delay_seconds);
    let begin_shutdown = async move {
        shutdown.await;
        draining.begin_drain();
        if !shutdown_delay.is_zero() {
            tracing::info!(delay = ?shutdown_delay, "shutting down: not ready, still serving");
            tokio::time::sleep(shutdown_delay).await;
        }
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
    };
    sluice_gateway::serve_data_plane(gateway, data, begin_shutdown, Duration::from_secs(args.drain_seconds)).await;
    let _ = admin_task.await;
    if let Some(controller) = controller {
        // Hands the lead over and withdraws this replica's report.
        let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    }
    if let Some(traces) = traces {
        // Sends the spans still queued.
        tokio::task::spawn_blocking(move || traces.shutdown()).await.ok();
    }
    if let Some(metrics_push) = metrics_push {
        // Pushes the final counts.
        tokio::task::spawn_blocking(move || metrics_push.shutdown()).await.ok();
    }
    tracing::info!("stopped");
    Ok(())
}

fn build_gateway(args: &RunArgs, state_store: Option<sluice_runtime::StateStore>) -> anyhow::Result<Arc<Gateway>> {
    let cache_dir = args.cache_dir.clone().or_else(|| crate::default_cache_dir("compiled"));
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir,
        max_instances: args.max_plugin_instances,
        max_guest_memory_bytes: args.max_guest_memory_bytes,
        max_instances_per_plugin: args.max_instances_per_plugin.max(1),
        token_counting_threads: args.token_counting_threads.max(1),
        plugin_log_lines_per_second: args.plugin_log_lines_per_second,
        max_snapshot_bytes: args.max_snapshot_bytes,
        keep_resident_bytes: args.plugin_keep_resident_bytes,
        restore_instances: args.plugin_restore_instances,
        snapshot_settle: Duration::from_millis(args.plugin_snapshot_settle_ms),
        snapshot_configure_budget: Duration::from_millis(args.plugin_snapshot_configure_budget_ms),
        state_limits: args.state.limits(),
        state_store,
        egress: sluice_runtime::EgressConfig {
            max_response_bytes: args.egress.egress_max_response_bytes,
            max_concurrent_calls: args.egress.egress_max_concurrent_calls.max(1),
            policy: Arc::new(backend_policy(args)),
        },
        guest_memory_namespace_percent: args.memory.max_guest_memory_namespace_percent,
        guest_memory_plugin_percent: args.memory.max_guest_memory_plugin_percent,
        ..Default::default()
    })
    .context("starting the plugin runtime")?;
    let registry = args.registry.registry().context("setting up the OCI registry client")?;
    let settings = Settings {
        max_body_bytes: args.max_body_bytes,
        oci_resync: Duration::from_secs(args.oci_resync_seconds.max(1)),
        max_ready_wait: Duration::from_secs(args.max_ready_wait_seconds),
        connections: Limits {
            max_connections: args.limits.max_connections,
            idle_timeout: Duration::from_secs(args.limits.idle_timeout_seconds.max(1)),
            header_read_timeout: Duration::from_secs(args.limits.header_read_timeout_seconds.max(1)),
            http2_max_concurrent_streams: args.limits.http2_max_concurrent_streams.max(1),
            write_timeout: Duration::from_secs(args.fairness.write_timeout_seconds.max(1)),
            ..Limits::default()
        },
        max_in_flight: args.limits.max_in_flight_requests,
        max_in_flight_per_connection: args.fairness.max_in_flight_per_connection.max(1),
        max_in_flight_per_peer_percent: args.fairness.max_in_flight_per_peer_percent,
        max_buffered_body_bytes: args.limits.max_buffered_body_bytes,
        request_body_timeout: Duration::from_secs(args.limits.request_body_timeout_seconds.max(1)),
        upstream_idle_timeout: Duration::from_secs(args.upstream_idle_timeout_seconds.max(1)),
        plugin_load_timeout: Duration::from_secs(args.plugin_load_timeout_seconds.max(1)),
        backends: Arc::new(backend_policy(args)),
        max_gateway_hops: args.backends.max_gateway_hops,
        response_buffers: sluice_gateway::ResponseBuffers::new(
            args.memory.max_buffered_response_bytes,
            args.memory.max_buffered_response_backend_percent,
        ),
        mcp_limits: args.mcp.limits(),
        mcp_session_keys: Arc::new(match &args.mcp.mcp_session_keys {
            Some(path) => sluice_gateway::McpSessionKeys::read(path)?,
            None => sluice_gateway::McpSessionKeys::ephemeral(),
        }),
        ..Settings::default()
    };
    Ok(Gateway::new(runtime, Some(registry), settings)?)
}

/// What backends may reach: restricted on Kubernetes or when asked, with
/// this host's addresses and the gateway's listener ports as its own.
fn backend_policy(args: &RunArgs) -> sluice_core::BackendPolicy {
    let restricted = args.kubernetes || args.backends.restrict_backends;
    let listeners = [Some(args.listen), Some(args.admin), args.probes, args.telemetry.metrics];
    sluice_core::BackendPolicy {
        restricted,
        allowed: args.backends.allow_backend_cidr.clone(),
        own_addresses: if restricted { sluice_core::backends::local_addresses() } else { Vec::new() },
        own_ports: listeners.into_iter().flatten().map(|addr| addr.port()).collect(),
    }
}

/// Starts the directory watcher, or the Kubernetes controller (whose task
/// is returned, to be awaited on shutdown).
async fn start_config_source(
    args: &RunArgs,
    gateway: &Gateway,
    updates: watch::Sender<Option<sluice_core::ConfigUpdate>>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    if let Some(config) = &args.config {
        tracing::info!(listen = %args.listen, admin = %args.admin, config = %config.display(), "sluice starting");
        tokio::spawn(FileSource::new(config).run(updates));
        return Ok(None);
    }
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let options = sluice_controller::Options {
        namespace: args.watch_namespace.clone(),
        lease_namespace: args.lease_namespace.clone(),
        replica: args.replica_name.clone().unwrap_or_else(hostname),
        tenancy: sluice_controller::Tenancy {
            host_file_dirs: args.allow_host_files_under.clone(),
            host_env_vars: args.allow_host_env.clone(),
            model_claims: args.model_claim.clone(),
            mcp_path_claims: args.mcp_path_claim.clone(),
            registry_credential_namespaces: args.registry_credentials_namespace.clone(),
            backends: backend_policy(args),
        },
    };
    tracing::info!(
        listen = %args.listen,
        admin = %args.admin,
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        replica = %options.replica,
        "sluice starting on Kubernetes"
    );
    let controller = sluice_controller::run(client, options, updates, gateway.load_reports(), stopped(stop));
    Ok(Some(tokio::spawn(controller)))
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
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

#[cfg(test)]
mod tests {
    //! `run` in-process, as the binary runs it: a config directory, an echo
    //! upstream, real listeners, and a shutdown that drains.

    use clap::Parser;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    /// One HTTP/1.1 exchange; the status code and the body.
    async fn exchange(addr: SocketAddr, request: &str) -> Option<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        Some((status, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_serves_a_config_directory_in_process_and_drains_on_shutdown() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(sluice_echo::serve(echo, Default::default(), std::future::pending()));
        let dir = tempfile::tempdir().unwrap();
        let route = format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: chat}}\n\
             spec: {{models: [m], backends: [{{url: 'http://{echo_addr}/v1'}}]}}\n"
        );
        std::fs::write(dir.path().join("routes.yaml"), route).unwrap();
        let (listen, admin) = (free_addr(), free_addr());
        let cache = dir.path().join("cache");
        let args = Cli::parse_from([
            "sluice".as_ref(),
            "--config".as_ref(),
            dir.path().as_os_str(),
            "--listen".as_ref(),
            listen.to_string().as_ref(),
            "--admin".as_ref(),
            admin.to_string().as_ref(),
            "--cache-dir".as_ref(),
            cache.join("compiled").as_os_str(),
            "--oci-cache-dir".as_ref(),
            cache.join("oci").as_os_str(),
        ])
        .run;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(run(args, async move {
            let _ = stopped.await;
        }));

        let ready = "GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while exchange(admin, ready).await.map(|(status, _)| status) != Some(200) {
            assert!(std::time::Instant::now() < deadline, "not ready in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let chat = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (status, reply) = exchange(listen, &chat).await.unwrap();
        assert_eq!(status, 200, "{reply}");
        assert!(reply.contains("chat.completion"), "{reply}");

        stop.send(()).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), running).await.expect("run did not stop");
        result.unwrap().unwrap();
        assert!(exchange(listen, &chat).await.is_none(), "still listening after shutdown");
    }
}

/// How the memory budgets are shared between tenants, so that no tenant
/// starves the others: plugins' guest memory, and upstream responses held in
/// memory.
#[derive(clap::Args)]
#[command(next_help_heading = "Memory shares")]
pub struct MemoryArgs {
    /// The share of --max-guest-memory-bytes one namespace's plugin
    /// instances may hold together, busy or idle, in percent; past it, a
    /// 503 for that namespace's plugins only. Idle instances give their
    /// memory back when a live one needs it.
    #[arg(long, default_value_t = RuntimeConfig::default().guest_memory_namespace_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_guest_memory_namespace_percent: u8,
    /// The share one plugin's instances may hold together, in percent; an
    /// instance alone is capped at it, and a plugin whose `configure` needs
    /// more is refused at load.
    #[arg(long, default_value_t = RuntimeConfig::default().guest_memory_plugin_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_guest_memory_plugin_percent: u8,
    /// Upstream response bytes all responses may hold in memory together
    /// (whole bodies for response-body plugins and provider translation,
    /// error bodies, unfinished events, usage copies), in bytes; past it,
    /// a 503 (or an unread usage).
    #[arg(long, default_value_t = Settings::DEFAULT_MAX_BUFFERED_RESPONSE_BYTES)]
    pub max_buffered_response_bytes: usize,
    /// The share of --max-buffered-response-bytes the responses of one
    /// backend may hold together, in percent.
    #[arg(long, default_value_t = Settings::DEFAULT_RESPONSE_BUFFER_BACKEND_PERCENT,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_buffered_response_backend_percent: u8,
}
