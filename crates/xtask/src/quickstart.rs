//! `cargo xtask quickstart`: the gateway with deploy/quickstart in front of
//! an echo upstream, and requests to try against it.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{self, Running};
use crate::{cargo, plugins, run, sluice_binary, step, target_dir};

const CONFIG_DIR: &str = "deploy/quickstart";
/// The upstream address the committed routes.yaml points at.
const DEFAULT_UPSTREAM: &str = "127.0.0.1:9000";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct Args {
    /// Where the gateway serves the OpenAI-compatible API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the gateway serves /readyz and /admin/config.
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// Where the echo upstream listens.
    #[arg(long, default_value = DEFAULT_UPSTREAM)]
    upstream: SocketAddr,
}

/// The plugins deploy/quickstart serves: the only ones it builds.
const PLUGINS: &[&str] = &["add-header", "deny"];

pub fn main(args: Args) -> Result<()> {
    step("Plugins: add-header and deny, as components without WASI (about 30 s the first time)");
    plugins::build_only(PLUGINS)?;
    // Only the binary, but with every dependency's features as the whole
    // workspace's build has them (crates/workspace-hack, the feature
    // `cargo xtask test` builds with too): the tests reuse all of it, and
    // the quickstart compiles no test.
    step("The sluice binary (minutes the first time on 2 cores; seconds after that)");
    run(cargo().args(["build", "--package", "sluice", "--bin", "sluice", "--features", "workspace-hack"]))?;

    // The committed config points at the default upstream. For another one,
    // serve a rewritten copy, which lives as long as `rewritten`.
    let rewritten = if args.upstream == DEFAULT_UPSTREAM.parse()? {
        None
    } else {
        let dir = tempfile::tempdir()?;
        copy_config_for_upstream(Path::new(CONFIG_DIR), dir.path(), args.upstream)?;
        println!(
            "Serving a copy of {CONFIG_DIR}/ in {} with the backend at {}: edit the copy, not {CONFIG_DIR}/.",
            dir.path().display(),
            args.upstream
        );
        Some(dir)
    };
    let config_dir = match &rewritten {
        None => PathBuf::from(CONFIG_DIR),
        Some(dir) => dir.path().to_path_buf(),
    };

    step("Starting the echo upstream and the gateway (a few seconds)");
    let logs = target_dir().join("quickstart");
    fs::create_dir_all(&logs)?;
    let sluice = sluice_binary("debug");

    let mut upstream_cmd = Command::new(&sluice);
    upstream_cmd.args(["echo-upstream", "--listen", &args.upstream.to_string()]);
    let mut upstream = Running::spawn("echo upstream", upstream_cmd, &logs.join("upstream.log"))?;

    let mut gateway_cmd = Command::new(&sluice);
    gateway_cmd
        .arg("run")
        .arg("--config")
        .arg(&config_dir)
        .args(["--listen", &args.listen.to_string()])
        .args(["--admin", &args.admin.to_string()]);
    let mut gateway = Running::spawn("gateway", gateway_cmd, &logs.join("gateway.log"))?;

    process::wait_for_listener(args.upstream, &mut [&mut upstream, &mut gateway], READY_TIMEOUT)?;
    process::wait_for_ready(args.admin, &mut [&mut upstream, &mut gateway], READY_TIMEOUT)?;

    print_try_it(&args, &config_dir, &logs);
    // Reloads and config errors show here as they happen, not only in the log.
    process::follow_log(&logs.join("gateway.log"), |line| {
        line.contains("config applied") || line.contains(" WARN ") || line.contains(" ERROR ")
    });

    let shutdown = process::shutdown_signal()?;
    loop {
        match shutdown.recv_timeout(Duration::from_millis(200)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                if let Err(exited) = upstream.check_alive().and_then(|()| gateway.check_alive()) {
                    // A terminal's Ctrl-C reaches the children too, and one
                    // may exit before we hear of it: that is not a failure.
                    if shutdown.recv_timeout(Duration::from_millis(500)).is_ok() {
                        break;
                    }
                    return Err(exited);
                }
            }
        }
    }
    println!("\nStopping the gateway and the echo upstream.");
    // Dropping them kills them.
    Ok(())
}

/// Copies the quickstart YAML into `dest` with the backend URL pointing at
/// `upstream`, and the plugin paths made absolute, since the relative ones
/// resolve against the file's own directory.
fn copy_config_for_upstream(source: &Path, dest: &Path, upstream: SocketAddr) -> Result<()> {
    let dist = fs::canonicalize("plugins/dist").context("plugins/dist is missing")?;
    let mut backend_found = false;
    for entry in fs::read_dir(source).with_context(|| format!("cannot read {}", source.display()))? {
        let path = entry?.path();
        if !matches!(path.extension().and_then(|ext| ext.to_str()), Some("yaml" | "yml")) {
            continue;
        }
        let yaml = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        backend_found |= yaml.contains(&format!("http://{DEFAULT_UPSTREAM}"));
        let yaml = yaml
            .replace(&format!("http://{DEFAULT_UPSTREAM}"), &format!("http://{upstream}"))
            .replace("../../plugins/dist/", &format!("{}/", dist.display()));
        fs::write(dest.join(path.file_name().expect("read_dir entries have names")), yaml)?;
    }
    if !backend_found {
        bail!("no backend URL http://{DEFAULT_UPSTREAM} in {} to point at {upstream}", source.display());
    }
    Ok(())
}

fn print_try_it(args: &Args, config_dir: &Path, logs: &Path) {
    let Args { listen, admin, .. } = args;
    let chat = format!("http://{listen}/v1/chat/completions");
    println!(
        r#"
Sluice is running: API on http://{listen}, admin on http://{admin}.
Logs: {logs}/gateway.log and {logs}/upstream.log

A chat request through the plugin chain. add-header sets `x-team: search` and
`"user": "team-search"`, which the echo upstream shows it received, and adds
`x-sluice-plugin: add-header` to the response:

  curl -i {chat} \
    -H 'content-type: application/json' \
    -d '{{"model": "gpt-4o-mini", "messages": [{{"role": "user", "content": "Hello"}}]}}'

The same, streamed as server-sent events:

  curl -N {chat} \
    -H 'content-type: application/json' \
    -d '{{"model": "gpt-4o-mini", "stream": true, "messages": [{{"role": "user", "content": "Hello"}}]}}'

A request the deny plugin rejects with 403, before it reaches the upstream:

  curl -i {chat} \
    -H 'content-type: application/json' -H 'x-tenant: blocked' \
    -d '{{"model": "gpt-4o-mini", "messages": [{{"role": "user", "content": "Hello"}}]}}'

What the gateway has loaded (routes, plugins and their digests, config errors):

  curl -s http://{admin}/admin/config

Edit the YAML in {config_dir}/ and the gateway reloads it; reloads and config
errors are shown below. Press Ctrl-C to stop.
"#,
        config_dir = config_dir.display(),
        logs = logs.display(),
    );
}
