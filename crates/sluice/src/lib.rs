//! The `sluice` program as a library: everything `main` wires together,
//! callable in-process (as linkerd2-proxy's thin `main` calls `linkerd-app`).

pub mod oci_cmd;
pub mod plugin_new;
pub mod run;

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/sluice/<leaf>` (or `~/.cache/sluice/<leaf>`).
pub fn default_cache_dir(leaf: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("sluice").join(leaf))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
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
