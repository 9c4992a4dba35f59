//! The systems `cargo xtask bench` compares, and how each is started.
//! Adding a system is one entry in [`SYSTEMS`] (plus its config template).

use std::ffi::OsStr;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::procfs;
use super::setup::Tools;
use crate::process::{self, Running};

/// How long a system (or the upstream) may take to start.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The baseline: oha straight to the upstream.
pub const DIRECT: &str = "direct";
/// The system the CPU-per-request ratios are relative to: the CPU goals
/// with plugins are fractions of it (at most 0.5× its CPU per request).
pub const RATIO_BASE: &str = "envoy-proxy-wasm";

/// The work the decorating systems do, the same everywhere: set this
/// header and put this system message first.
pub const HEADER_NAME: &str = "x-team";
pub const HEADER_VALUE: &str = "search";
pub const SYSTEM_PROMPT: &str = "You are a helpful assistant.";
/// The API key requests carry (but the JWT systems'); the auth plugin
/// knows its SHA-256.
pub const API_KEY: &str = "sk-bench-0123456789abcdef";
pub const API_KEY_CONSUMER: &str = "key:bench";
/// The JWT the `sluice-jwt` systems' requests carry instead: RS256, `sub`
/// bench, expiring in 2100, signed with plugins/auth/testdata/rsa-private.pem
/// (`openssl dgst -sha256 -sign` over its first two parts).
pub const JWT: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6InJzYS0xIn0.\
    eyJzdWIiOiJiZW5jaCIsImlzcyI6Imh0dHBzOi8vaWRwLmV4YW1wbGUiLCJhdWQiOiJzbHVpY2UiLCJleHAiOjQxMDI0NDQ4MDB9.\
    VvySwfW9j0DKtP2bYromAuXKHuZ8-sfxGPQv0DCJB63XCZsyIMj0y4zIFXqpE5TW3PwaE8nQ6IAWtYREpYDHrIXVN7jaGcz4aEtdBz5R8p6wIlTlnQu3\
    os871yg3Y4KNjSvcdite12Spb357Uc98r4rjTN3kQIvXQy731x0vIMTYjMsCwLdrQo2rdEIgJg-zZw-83q9hcuxoT4N5y9JN_9ePtvrkNJoVplW1KOeA\
    pnUG2PeHW6D2BbcKaASZxrpIpqhmU4BbYRnjOdXwObtf4gZ8TCi4TS9xkXPY9zUy_EgmI4KV-UWia69Usz-T6BmKC7yyZWB3ora7uyGaTVWJfQ";
pub const JWT_CONSUMER: &str = "jwt:bench";

pub struct System {
    /// Its name in the table and for `--systems`.
    pub name: &'static str,
    /// What it runs, for the table's legend.
    pub about: &'static str,
    pub kind: Kind,
    pub work: Work,
}

pub enum Kind {
    /// No system: oha talks to the upstream.
    Direct,
    /// `sluice run` with this config template, its placeholders filled in
    /// with these values besides the common ones, and its telemetry as
    /// shipped: the JSON access log on, metrics served, no traces.
    Sluice(&'static str, &'static [(&'static str, &'static str)]),
    /// [`Kind::Sluice`] with its telemetry changed.
    SluiceObserved(&'static str, &'static [(&'static str, &'static str)], Observe),
    /// Envoy (`--concurrency 2`) with this bootstrap template.
    Envoy(&'static str),
    /// nginx with this config template.
    Nginx(&'static str),
    /// The bare hyper proxy of tests/bench/hyper-proxy.
    HyperProxy,
    /// The LiteLLM proxy (one worker) with this config template, next to
    /// [`LITELLM_HOOK`], which the config names.
    Litellm(&'static str),
}

/// LiteLLM's pre-call hook doing the filter's work, a template too.
const LITELLM_HOOK: &str = "tests/bench/litellm/decorate.py";

/// What a system does to a request, checked at the upstream before it is
/// measured.
pub struct Work {
    /// Sets [`HEADER_NAME`] and prepends the [`SYSTEM_PROMPT`] message.
    pub decorates: bool,
    /// Takes the credential off and names the consumer.
    pub authenticates: bool,
    /// What its requests carry: the others forward it.
    pub credential: Credential,
}

pub enum Credential {
    /// [`API_KEY`] in `x-api-key`.
    ApiKey,
    /// [`JWT`] as a bearer token.
    Jwt,
}

impl Credential {
    pub fn header(&self) -> (&'static str, String) {
        match self {
            Credential::ApiKey => ("x-api-key", API_KEY.to_owned()),
            Credential::Jwt => ("authorization", format!("Bearer {JWT}")),
        }
    }

    /// The consumer the auth plugin names for it.
    pub fn consumer(&self) -> &'static str {
        match self {
            Credential::ApiKey => API_KEY_CONSUMER,
            Credential::Jwt => JWT_CONSUMER,
        }
    }
}

const PROXY: Work = Work { decorates: false, authenticates: false, credential: Credential::ApiKey };
const DECORATES: Work = Work { decorates: true, authenticates: false, credential: Credential::ApiKey };
const CHAIN: Work = Work { decorates: false, authenticates: true, credential: Credential::ApiKey };
const JWT_AUTH: Work = Work { decorates: false, authenticates: true, credential: Credential::Jwt };

/// Plugins instantiated fresh for every request (the default), or reused
/// across requests (`isolation: Reused`), as proxy-wasm hosts do.
const PER_REQUEST: &[(&str, &str)] = &[("ISOLATION", "PerRequest")];
const REUSED: &[(&str, &str)] = &[("ISOLATION", "Reused")];

/// add-header and prompt-decorator as built now, or as built against
/// `sluice:plugin@0.2.0` (tests/fixtures/plugins-v0.2): each parsed and
/// rewrote the JSON body itself. A value naming another placeholder is
/// filled in by it, as extras come first.
const DECORATE: &[(&str, &str)] = &[("ISOLATION", "PerRequest"), ("DECORATE_DIST", "${PLUGINS_DIST}")];
const DECORATE_REUSED: &[(&str, &str)] = &[("ISOLATION", "Reused"), ("DECORATE_DIST", "${PLUGINS_DIST}")];
const DECORATE_V02: &[(&str, &str)] = &[("ISOLATION", "PerRequest"), ("DECORATE_DIST", "${PLUGINS_V02}")];
const DECORATE_V02_REUSED: &[(&str, &str)] = &[("ISOLATION", "Reused"), ("DECORATE_DIST", "${PLUGINS_V02}")];

/// The decorator-lite example (plugins/examples) in one language and one
/// isolation mode.
macro_rules! lite {
    ($name:literal, $language:literal, $wasm:literal, $isolation:literal) => {
        System {
            name: $name,
            about: concat!(
                "Sluice doing the filter's work in one component, the ",
                $language,
                " decorator-lite example (it also sets a response header), isolation ",
                $isolation
            ),
            kind: Kind::Sluice(
                "tests/bench/sluice/decorator-lite.yaml.tmpl",
                &[("EXAMPLE", $wasm), ("ISOLATION", $isolation)],
            ),
            work: DECORATES,
        }
    };
}

pub const SYSTEMS: &[System] = &[
    System { name: DIRECT, about: "oha straight to the upstream (the baseline)", kind: Kind::Direct, work: PROXY },
    System {
        name: "sluice-plain",
        about: "Sluice, a route with no plugin",
        kind: Kind::Sluice("tests/bench/sluice/plain.yaml.tmpl", &[]),
        work: PROXY,
    },
    System {
        name: "sluice-plain-quiet",
        about: "`sluice-plain` with its access log off",
        kind: Kind::SluiceObserved("tests/bench/sluice/plain.yaml.tmpl", &[], Observe::Quiet),
        work: PROXY,
    },
    System {
        name: "sluice-decorate",
        about: "Sluice doing the filter's work with first-party plugins: add-header + prompt-decorator \
                (prompt-decorator cannot set headers), a fresh instance per request",
        kind: Kind::Sluice("tests/bench/sluice/decorate.yaml.tmpl", DECORATE),
        work: DECORATES,
    },
    System {
        name: "sluice-decorate-reused",
        about: "`sluice-decorate` with `isolation: Reused`",
        kind: Kind::Sluice("tests/bench/sluice/decorate.yaml.tmpl", DECORATE_REUSED),
        work: DECORATES,
    },
    System {
        name: "sluice-decorate-v02",
        about: "`sluice-decorate` with the plugins as built for sluice:plugin@0.2.0, which parse and rewrite \
                the body themselves (tests/fixtures/plugins-v0.2)",
        kind: Kind::Sluice("tests/bench/sluice/decorate.yaml.tmpl", DECORATE_V02),
        work: DECORATES,
    },
    System {
        name: "sluice-decorate-v02-reused",
        about: "`sluice-decorate-v02` with `isolation: Reused`",
        kind: Kind::Sluice("tests/bench/sluice/decorate.yaml.tmpl", DECORATE_V02_REUSED),
        work: DECORATES,
    },
    System {
        name: "sluice-chain",
        about: "Sluice with auth (API key) + prompt-template + context-trim, a fresh instance per request",
        kind: Kind::Sluice("tests/bench/sluice/chain.yaml.tmpl", PER_REQUEST),
        work: CHAIN,
    },
    System {
        name: "sluice-chain-reused",
        about: "`sluice-chain` with `isolation: Reused`",
        kind: Kind::Sluice("tests/bench/sluice/chain.yaml.tmpl", REUSED),
        work: CHAIN,
    },
    System {
        name: "sluice-chain-quiet",
        about: "`sluice-chain` with its access log off",
        kind: Kind::SluiceObserved("tests/bench/sluice/chain.yaml.tmpl", PER_REQUEST, Observe::Quiet),
        work: CHAIN,
    },
    System {
        name: "sluice-chain-quota",
        about: "`sluice-chain` + token-quota (requests and tokens per consumer) on the in-process state store",
        kind: Kind::Sluice("tests/bench/sluice/chain-quota.yaml.tmpl", PER_REQUEST),
        work: CHAIN,
    },
    System {
        name: "sluice-chain-quota-redis",
        about: "`sluice-chain-quota` with its state in Redis on loopback (Redis's CPU not counted, as on another host)",
        kind: Kind::SluiceObserved("tests/bench/sluice/chain-quota.yaml.tmpl", PER_REQUEST, Observe::Redis),
        work: CHAIN,
    },
    System {
        name: "sluice-cache-hit",
        about: "Sluice with auth (API key) + response-cache, every measured request a hit (in-process store)",
        kind: Kind::Sluice("tests/bench/sluice/cache.yaml.tmpl", PER_REQUEST),
        work: CHAIN,
    },
    System {
        name: "sluice-jwt",
        about: "Sluice with the auth plugin alone, checking an RS256 JWT (verified by the gateway, natively), \
                a fresh instance per request",
        kind: Kind::Sluice("tests/bench/sluice/jwt.yaml.tmpl", PER_REQUEST),
        work: JWT_AUTH,
    },
    System {
        name: "sluice-jwt-reused",
        about: "`sluice-jwt` with `isolation: Reused`",
        kind: Kind::Sluice("tests/bench/sluice/jwt.yaml.tmpl", REUSED),
        work: JWT_AUTH,
    },
    System {
        name: "sluice-decorate-reused-traced",
        about: "`sluice-decorate-reused` with every request traced (100% sampled) to an OpenTelemetry \
                Collector over OTLP/gRPC",
        kind: Kind::SluiceObserved("tests/bench/sluice/decorate.yaml.tmpl", DECORATE_REUSED, Observe::Traced),
        work: DECORATES,
    },
    lite!("sluice-rust", "Rust", "example-rust.wasm", "PerRequest"),
    lite!("sluice-rust-reused", "Rust", "example-rust.wasm", "Reused"),
    lite!("sluice-c", "C", "example-c.wasm", "PerRequest"),
    lite!("sluice-c-reused", "C", "example-c.wasm", "Reused"),
    lite!("sluice-python", "Python (componentize-py)", "example-python.wasm", "PerRequest"),
    lite!("sluice-python-reused", "Python (componentize-py)", "example-python.wasm", "Reused"),
    lite!("sluice-js", "JavaScript (ComponentizeJS)", "example-js.wasm", "PerRequest"),
    lite!("sluice-js-reused", "JavaScript (ComponentizeJS)", "example-js.wasm", "Reused"),
    System {
        name: "envoy",
        about: "Envoy, plain reverse proxy, --concurrency 2",
        kind: Kind::Envoy("tests/bench/envoy/plain.yaml.tmpl"),
        work: PROXY,
    },
    System {
        name: RATIO_BASE,
        about: "Envoy + the Rust proxy-wasm filter of tests/bench/proxy-wasm-filter (V8), --concurrency 2",
        kind: Kind::Envoy("tests/bench/envoy/proxy-wasm.yaml.tmpl"),
        work: DECORATES,
    },
    System {
        name: "nginx",
        about: "nginx, plain reverse proxy, one worker, pooled upstream connections",
        kind: Kind::Nginx("tests/bench/nginx/proxy.conf.tmpl"),
        work: PROXY,
    },
    System {
        name: "hyper-proxy",
        about: "a reverse proxy on Sluice's stack (hyper, hyper-util's pooled client, one current-thread tokio \
                runtime) doing nothing else: tests/bench/hyper-proxy",
        kind: Kind::HyperProxy,
        work: PROXY,
    },
    System {
        name: "litellm",
        about: "LiteLLM proxy (Python, one uvicorn worker) doing the filter's work in an `async_pre_call_hook`",
        kind: Kind::Litellm("tests/bench/litellm/config.yaml.tmpl"),
        work: DECORATES,
    },
];

/// How a Sluice system's telemetry differs from what `sluice run` ships
/// (metrics always on, as Envoy's stats are; the JSON access log on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observe {
    /// The access log off (`--access-log=false`), as nginx's is here and
    /// Envoy has none: what the log costs is the difference.
    Quiet,
    /// The access log, and a trace of every request sent over OTLP/gRPC to
    /// an OpenTelemetry Collector on loopback (the one the tests build).
    Traced,
    /// Plugins' state in a Redis (Debian's `redis-server`) on loopback,
    /// pinned to the load's core: like a Redis on another host, its CPU is
    /// not the gateway's.
    Redis,
}

/// A started system: where to send requests, and its processes (none for
/// direct).
pub struct Started {
    pub addr: SocketAddr,
    /// Sluice's admin listener.
    pub admin: Option<SocketAddr>,
    tree: Option<ProcessTree>,
    /// A process the system needs beside it, not measured (the collector a
    /// traced Sluice sends to).
    _beside: Option<Running>,
}

impl Started {
    /// The root of the process tree whose CPU time and memory are measured.
    pub fn pid(&self) -> Option<u32> {
        self.tree.as_ref().map(|tree| tree.pid)
    }

    pub fn check_alive(&mut self) -> Result<()> {
        self.tree.as_mut().map_or(Ok(()), ProcessTree::check_alive)
    }

    /// Stops it with SIGTERM and waits for it to exit, as a build that
    /// writes a profile at exit needs (dropping it kills it).
    pub fn stop(mut self, timeout: Duration) -> Result<()> {
        self.tree.as_mut().map_or(Ok(()), |tree| tree.running.terminate(timeout))
    }
}

/// A started process and its descendants, all stopped when dropped:
/// `Running` kills only its own child, and nginx's workers would outlive a
/// killed master, still holding the port.
pub struct ProcessTree {
    running: Running,
    pid: u32,
}

impl ProcessTree {
    /// `running`, whose command line holds `marker` (a path unique to it).
    fn new(running: Running, marker: &Path) -> Result<Self> {
        let pid = procfs::child_with_arg(marker)?;
        Ok(ProcessTree { running, pid })
    }

    pub fn check_alive(&mut self) -> Result<()> {
        self.running.check_alive()
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        let descendants = procfs::descendants(self.pid).unwrap_or_default();
        if !descendants.is_empty() {
            // nginx's master stops its workers on TERM; the root itself
            // stays a zombie until `Running` reaps it.
            process::signal("TERM", self.pid);
            let deadline = Instant::now() + Duration::from_secs(5);
            while descendants.iter().any(procfs::Process::is_running) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            for process in descendants.iter().filter(|process| process.is_running()) {
                process::signal("KILL", process.pid);
            }
        }
        // Then `running` is dropped, which kills and reaps the root.
    }
}

impl System {
    /// Starts the system pinned to `core`, its files in `dir`, in front of
    /// `upstream`. Returns once it listens (Sluice: once /readyz says so).
    /// Starts it on `core`; a Sluice system with `routes` routes in all.
    pub fn start(&self, tools: &Tools, dir: &Path, upstream: SocketAddr, core: u32, routes: u32) -> Result<Started> {
        let listen = process::free_local_addr()?;
        let admin = process::free_local_addr()?;
        let mut values = vec![
            ("LISTEN_ADDR", listen.to_string()),
            ("LISTEN_PORT", listen.port().to_string()),
            ("ADMIN_PORT", admin.port().to_string()),
            ("UPSTREAM_ADDR", upstream.to_string()),
            ("UPSTREAM_PORT", upstream.port().to_string()),
            ("HEADER_NAME", HEADER_NAME.to_owned()),
            ("HEADER_VALUE", HEADER_VALUE.to_owned()),
            ("SYSTEM_PROMPT", SYSTEM_PROMPT.to_owned()),
        ];
        match self.kind {
            Kind::Direct => Ok(Started { addr: upstream, admin: None, tree: None, _beside: None }),
            Kind::Sluice(template, extra) | Kind::SluiceObserved(template, extra, _) => {
                let config_dir = dir.join("config");
                fs::create_dir(&config_dir)?;
                values.extend(extra.iter().map(|(name, value)| (*name, (*value).to_owned())));
                values.push(("PLUGINS_DIST", tools.plugins_dist.display().to_string()));
                values.push(("PLUGINS_V02", tools.plugins_v02.display().to_string()));
                values.push(("API_KEY_SHA256", hex::encode(Sha256::digest(API_KEY))));
                render(template, &config_dir.join("bench.yaml"), &values)?;
                if routes > 1 {
                    fs::write(config_dir.join("filler.yaml"), filler_routes(routes - 1, upstream))?;
                }
                let mut cmd = pinned(core, &tools.sluice);
                cmd.arg("run")
                    .arg("--config")
                    .arg(&config_dir)
                    .args(["--listen", &listen.to_string(), "--admin", &admin.to_string()])
                    // Compiled plugins are cached across runs: each start
                    // is a warm start, not a compile.
                    .arg("--cache-dir")
                    .arg(&tools.sluice_cache)
                    .env("RUST_LOG", "warn");
                let mut beside = None;
                // What `sluice run` writes to a file or a pod log; named,
                // so that a terminal running the bench changes nothing.
                cmd.args(["--log-format", "json"]);
                match self.kind {
                    Kind::SluiceObserved(_, _, Observe::Quiet) => {
                        cmd.arg("--access-log=false");
                    }
                    Kind::SluiceObserved(_, _, Observe::Redis) => {
                        let (redis, url) = start_redis(dir)?;
                        beside = Some(redis);
                        cmd.arg("--state-redis-url").arg(url);
                    }
                    Kind::SluiceObserved(_, _, Observe::Traced) => {
                        let (collector, endpoint) = start_collector(dir)?;
                        beside = Some(collector);
                        cmd.args(["--otlp-protocol", "grpc", "--trace-sample-ratio", "1"])
                            .arg("--otlp-endpoint")
                            .arg(endpoint);
                    }
                    _ => {}
                }
                let mut running = Running::spawn(self.name, cmd, &dir.join("sluice.log"))?;
                process::wait_for_ready(admin, &mut [&mut running], READY_TIMEOUT)?;
                let tree = Some(ProcessTree::new(running, &config_dir)?);
                Ok(Started { addr: listen, admin: Some(admin), tree, _beside: beside })
            }
            Kind::Envoy(template) => {
                values.push(("FILTER_WASM", tools.peers()?.proxy_wasm_filter.display().to_string()));
                let config = dir.join("envoy.yaml");
                render(template, &config, &values)?;
                let mut cmd = pinned(core, &tools.peers()?.envoy);
                cmd.arg("-c").arg(&config).args(["--concurrency", "2", "--disable-hot-restart", "--log-level", "warn"]);
                let mut running = Running::spawn(self.name, cmd, &dir.join("envoy.log"))?;
                process::wait_for_listener(listen, &mut [&mut running], READY_TIMEOUT)?;
                Ok(Started {
                    addr: listen,
                    admin: None,
                    tree: Some(ProcessTree::new(running, &config)?),
                    _beside: None,
                })
            }
            Kind::Nginx(template) => Ok(Started {
                addr: listen,
                admin: None,
                tree: Some(start_nginx(self.name, template, tools, dir, core, &values)?),
                _beside: None,
            }),
            Kind::HyperProxy => {
                let mut cmd = pinned(core, &tools.peers()?.hyper_proxy);
                cmd.args(["--listen", &listen.to_string(), "--upstream", &upstream.to_string()]);
                let mut running = Running::spawn(self.name, cmd, &dir.join("hyper-proxy.log"))?;
                process::wait_for_listener(listen, &mut [&mut running], READY_TIMEOUT)?;
                // Its listening address is on no other child's command line.
                let tree = ProcessTree::new(running, Path::new(&listen.to_string()))?;
                Ok(Started { addr: listen, admin: None, tree: Some(tree), _beside: None })
            }
            Kind::Litellm(template) => {
                // The config names the hook as a module next to it.
                let config = dir.join("config.yaml");
                render(template, &config, &values)?;
                render(LITELLM_HOOK, &dir.join("decorate.py"), &values)?;
                let mut cmd = pinned(core, &tools.peers()?.litellm);
                cmd.arg("--config")
                    .arg(&config)
                    .args(["--host", "127.0.0.1", "--port", &listen.port().to_string(), "--num_workers", "1"])
                    // Whatever it writes to its working directory goes
                    // with the run.
                    .current_dir(dir)
                    // No internet: the bundled model cost map, not a fetch.
                    .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                    // Measure the proxy, not per-request (access) logging.
                    .env("LITELLM_LOG", "WARNING");
                let mut running = Running::spawn(self.name, cmd, &dir.join("litellm.log"))?;
                process::wait_for_listener(listen, &mut [&mut running], READY_TIMEOUT)?;
                Ok(Started {
                    addr: listen,
                    admin: None,
                    tree: Some(ProcessTree::new(running, &config)?),
                    _beside: None,
                })
            }
        }
    }
}

/// Runs nginx in the foreground with `template` rendered into `prefix`
/// (its own pid file and temp directories), pinned to `core`; returns once
/// it listens on `LISTEN_ADDR`.
pub fn start_nginx(
    name: &'static str,
    template: &str,
    tools: &Tools,
    prefix: &Path,
    core: u32,
    values: &[(&str, String)],
) -> Result<ProcessTree> {
    fs::create_dir_all(prefix)?;
    let mut values = values.to_vec();
    values.push(("PREFIX", prefix.display().to_string()));
    let listen: SocketAddr =
        values.iter().find(|(name, _)| *name == "LISTEN_ADDR").context("nginx needs a LISTEN_ADDR")?.1.parse()?;
    let config = prefix.join("nginx.conf");
    render(template, &config, &values)?;
    let mut cmd = pinned(core, &tools.nginx);
    // -e: the error log from the start, before the config names one (the
    // compiled-in default is under /var/log).
    cmd.args(["-e", "stderr", "-p"]).arg(prefix).arg("-c").arg(&config);
    let mut running = Running::spawn(name, cmd, &prefix.join("nginx.log"))?;
    process::wait_for_listener(listen, &mut [&mut running], READY_TIMEOUT)?;
    ProcessTree::new(running, &config)
}

/// `count` routes for models no request names, to the same upstream.
fn filler_routes(count: u32, upstream: SocketAddr) -> String {
    let mut yaml = String::new();
    for i in 0..count {
        yaml.push_str(&format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: filler-{i}\nspec:\n  \
             models: [filler-model-{i}]\n  backends:\n    - url: http://{upstream}/v1\n---\n"
        ));
    }
    yaml
}

/// Writes `template` to `dest` with each `${NAME}` replaced by its value;
/// fails on a placeholder it has no value for.
fn render(template: &str, dest: &Path, values: &[(&str, String)]) -> Result<()> {
    let mut text = fs::read_to_string(template).with_context(|| format!("cannot read {template}"))?;
    for (name, value) in values {
        text = text.replace(&format!("${{{name}}}"), value);
    }
    if let Some(at) = text.find("${") {
        let rest = &text[at..];
        let placeholder = &rest[..rest.find('}').map_or(rest.len(), |end| end + 1)];
        bail!("{template} has an unknown placeholder {placeholder}");
    }
    fs::write(dest, text).with_context(|| format!("cannot write {}", dest.display()))
}

/// `taskset -c CORE PROGRAM`: `taskset` executes the program, so the pid is
/// the program's.
pub fn pinned(core: u32, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &core.to_string()]).arg(program);
    cmd
}

/// The OpenTelemetry Collector the tests build (OTLP in, spans to a file in
/// `dir`), on a free loopback port; returns it and its gRPC endpoint.
/// A Redis with no persistence on a free loopback port, on core 1 (the
/// load's), for plugins' state.
fn start_redis(dir: &Path) -> Result<(Running, String)> {
    let addr = process::free_local_addr()?;
    let mut cmd = pinned(1, "redis-server");
    cmd.args(["--bind", "127.0.0.1", "--port", &addr.port().to_string(), "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir);
    let mut redis = Running::spawn("redis-server", cmd, &dir.join("redis.log"))?;
    process::wait_for_listener(addr, &mut [&mut redis], READY_TIMEOUT)?;
    Ok((redis, format!("redis://{addr}")))
}

fn start_collector(dir: &Path) -> Result<(Running, String)> {
    let binary = crate::otelcol::ensure()?;
    let grpc = process::free_local_addr()?;
    let config = dir.join("otelcol.yaml");
    let spans = dir.join("spans.jsonl");
    fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: {grpc}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 1s\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n\
             \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            spans.display()
        ),
    )?;
    let mut cmd = Command::new(binary);
    cmd.arg("--config").arg(&config);
    let mut collector = Running::spawn("otelcol", cmd, &dir.join("otelcol.log"))?;
    process::wait_for_listener(grpc, &mut [&mut collector], READY_TIMEOUT)?;
    Ok((collector, format!("http://{grpc}")))
}
