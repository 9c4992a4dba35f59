//! Standalone mode's config source: GatewayPlugin, AIModelRoute and MCPRoute
//! YAML in a directory, as they would be applied to a cluster.
//!
//! A source publishes the whole desired state on a watch channel, the
//! latest only: [`FileSource`] here, and the Kubernetes feed in
//! `sluice-controller`. Both have the same shape, an
//! `async fn run(self, updates: watch::Sender<Option<ConfigUpdate>>)`, and
//! neither is part of the data plane, which so compiles no Kubernetes types.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use sluice_api::Document;
use sluice_core::{ConfigUpdate, DesiredConfig, PluginSource, ResourceError};
use tokio::sync::{mpsc, watch};

/// Editors and `cp` write in several steps; wait for quiet before reading.
const SETTLE: Duration = Duration::from_millis(50);
/// Re-read now and then even without an event: a plugin's .wasm may live
/// outside the watched directory, and some filesystems send no events.
const POLL: Duration = Duration::from_secs(2);

pub struct FileSource {
    dir: PathBuf,
}

impl FileSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

impl FileSource {
    /// Publishes the directory's desired config, then again after every
    /// change, until the receiving side is dropped.
    pub async fn run(self, updates: watch::Sender<Option<ConfigUpdate>>) {
        // A wake-up, not a queue: every read is of the whole directory, so
        // one pending event stands for any number.
        let (events_tx, mut events) = mpsc::channel(1);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|event| changes_files(&event.kind)) {
                let _ = events_tx.try_send(());
            }
        });
        // Without a watcher, polling alone still picks up every change.
        let _watcher = match watcher {
            Ok(mut watcher) => match watcher.watch(&self.dir, RecursiveMode::Recursive) {
                Ok(()) => Some(watcher),
                Err(error) => {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot watch config dir; polling only");
                    None
                }
            },
            Err(error) => {
                tracing::warn!(%error, "no filesystem watcher; polling only");
                None
            }
        };

        let mut last_fingerprint = None;
        // What the files looked like at the last read, and the plugin files it named.
        let mut last_stat: Option<([u8; 32], Vec<PathBuf>)> = None;
        let mut event = true;
        loop {
            let dir = self.dir.clone();
            let known = last_stat.take();
            let read = tokio::task::spawn_blocking(move || {
                // A poll with nothing changed on disk only stats the files:
                // reading and parsing 10,000 resources every 2 s would cost
                // half a core while idle. An event always reads.
                let plugin_files = known.as_ref().map(|(_, files)| files.clone()).unwrap_or_default();
                let stat = stat_fingerprint(&dir, &plugin_files);
                if !event && known.as_ref().is_some_and(|(before, _)| *before == stat) {
                    return (None, known);
                }
                let (update, fingerprint) = read_dir(&dir);
                let plugin_files = plugin_files_of(&update);
                // Stat again with the plugin files this read names.
                let stat = stat_fingerprint(&dir, &plugin_files);
                (Some((update, fingerprint)), Some((stat, plugin_files)))
            })
            .await;
            if let Ok((read, stat)) = read {
                last_stat = stat;
                if let Some((update, fingerprint)) = read
                    && last_fingerprint != Some(fingerprint)
                {
                    last_fingerprint = Some(fingerprint);
                    if updates.send(Some(update)).is_err() {
                        return;
                    }
                }
            }
            event = tokio::select! {
                event = events.recv() => {
                    if event.is_none() {
                        return;
                    }
                    tokio::time::sleep(SETTLE).await;
                    while events.try_recv().is_ok() {}
                    true
                }
                () = tokio::time::sleep(POLL) => false,
                () = updates.closed() => return,
            };
        }
    }
}

/// Reads every `*.yaml`/`*.yml` under `dir`, in path order. The fingerprint
/// covers the YAML text and the size and mtime of each plugin file, so an
/// unchanged directory is not rebuilt, and a rebuilt plugin is.
fn read_dir(dir: &Path) -> (ConfigUpdate, [u8; 32]) {
    let mut hasher = Sha256::new();
    let mut files = BTreeMap::new();
    let mut errors = Vec::new();
    collect_yaml(dir, &mut files, &mut errors, &mut BTreeSet::new());
    if files.is_empty() && errors.is_empty() {
        errors.push(ResourceError::new(format!("file {}", dir.display()), "no *.yaml or *.yml files found"));
    }

    let mut desired = DesiredConfig::default();
    for (path, text) in &files {
        hasher.update(path.to_string_lossy().as_bytes());
        hasher.update(text.as_bytes());
        let base = path.parent().unwrap_or(dir);
        for document in sluice_api::parse_documents(text) {
            let result = document.map_err(|e| e.to_string()).and_then(|document| match document {
                Document::Plugin(plugin) => plugin
                    .decl(base)
                    .and_then(|decl| no_secret_refs(plugin.secret_names()).map(|()| desired.plugins.push(decl)))
                    .map_err(|e| format!("GatewayPlugin {}: {e}", plugin.key())),
                Document::Route(route) => route
                    .decl(base)
                    .and_then(|decl| no_secret_refs(route.secret_names()).map(|()| desired.routes.push(decl)))
                    .map_err(|e| format!("AIModelRoute {}: {e}", route.key())),
                // In file order, as routes: the order is the precedence when
                // two claim one path (DesiredConfig::mcp_conflicts).
                Document::McpRoute(route) => route
                    .decl(base)
                    .and_then(|decl| no_secret_refs(route.secret_names()).map(|()| desired.mcp_routes.push(decl)))
                    .map_err(|e| format!("MCPRoute {}: {e}", route.key())),
            });
            if let Err(message) = result {
                errors.push(ResourceError::new(format!("file {}", path.display()), message));
            }
        }
    }
    for plugin in &desired.plugins {
        // A registry's tags are followed by the gateway, not by this watcher.
        let PluginSource::File(path) = &plugin.source else { continue };
        if let Ok(meta) = std::fs::metadata(path) {
            hasher.update(path.to_string_lossy().as_bytes());
            hasher.update(meta.len().to_le_bytes());
            let modified = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
            hasher.update(modified.unwrap_or_default().as_nanos().to_le_bytes());
        }
    }
    for error in &errors {
        hasher.update(error.message.as_bytes());
    }
    let fingerprint = hasher.finalize().into();
    let update = if errors.is_empty() { ConfigUpdate::Desired(desired) } else { ConfigUpdate::Invalid(errors) };
    (update, fingerprint)
}

/// Whether a watcher event may change what the directory says. Opening and
/// reading are not: inotify reports our own reads, and taking them as
/// changes made every read cause the next one, 20 times a second.
fn changes_files(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// The plugin files a config names (they may live outside the directory).
fn plugin_files_of(update: &ConfigUpdate) -> Vec<PathBuf> {
    let ConfigUpdate::Desired(desired) = update else { return Vec::new() };
    let files = desired.plugins.iter().filter_map(|plugin| match &plugin.source {
        PluginSource::File(path) => Some(path.clone()),
        _ => None,
    });
    files.collect()
}

/// What a poll compares before reading anything: the path, size, mtime,
/// ctime and inode of each YAML file and of each plugin file. Editors that
/// replace a file change its inode; writes in place change mtime and ctime.
fn stat_fingerprint(dir: &Path, plugin_files: &[PathBuf]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let mut stat = |path: &Path| {
        hasher.update(path.to_string_lossy().as_bytes());
        match std::fs::metadata(path) {
            Ok(meta) => {
                hasher.update(meta.len().to_le_bytes());
                let modified = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
                hasher.update(modified.unwrap_or_default().as_nanos().to_le_bytes());
                #[cfg(unix)]
                {
                    use std::os::unix::fs::MetadataExt;
                    hasher.update(meta.ino().to_le_bytes());
                    hasher.update(meta.ctime().to_le_bytes());
                    hasher.update(meta.ctime_nsec().to_le_bytes());
                }
            }
            Err(error) => hasher.update(error.to_string().as_bytes()),
        }
    };
    let mut errors = Vec::new();
    walk_yaml(dir, &mut |path| stat(path), &mut errors, &mut BTreeSet::new());
    for path in plugin_files {
        stat(path);
    }
    for error in &errors {
        hasher.update(error.message.as_bytes());
    }
    hasher.finalize().into()
}

/// Secrets live in the Kubernetes API; a directory has none to refer to.
fn no_secret_refs<'a>(mut names: impl Iterator<Item = &'a str>) -> Result<(), String> {
    match names.next() {
        Some(name) => Err(format!(
            "refers to Secret `{name}`, but Secrets need `sluice run --kubernetes`; \
             in standalone mode put the value in `config`, or use a backend's (or MCP server's) apiKeyFile or apiKeyEnv"
        )),
        None => Ok(()),
    }
}

/// Reads every YAML file under `dir`.
fn collect_yaml(
    dir: &Path,
    files: &mut BTreeMap<PathBuf, String>,
    errors: &mut Vec<ResourceError>,
    seen: &mut BTreeSet<PathBuf>,
) {
    let mut failed = Vec::new();
    walk_yaml(
        dir,
        &mut |path| match std::fs::read_to_string(path) {
            Ok(text) => {
                files.insert(path.to_path_buf(), text);
            }
            Err(error) => failed.push(ResourceError::new(format!("file {}", path.display()), error)),
        },
        errors,
        seen,
    );
    errors.extend(failed);
}

/// Calls `visit` with every YAML file under `dir`. Each directory is read
/// once, by its canonical path, so a link back up the tree cannot make it loop.
fn walk_yaml(dir: &Path, visit: &mut dyn FnMut(&Path), errors: &mut Vec<ResourceError>, seen: &mut BTreeSet<PathBuf>) {
    match std::fs::canonicalize(dir) {
        Ok(canonical) => {
            if !seen.insert(canonical) {
                return;
            }
        }
        Err(error) => {
            errors.push(ResourceError::new(format!("file {}", dir.display()), error));
            return;
        }
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            errors.push(ResourceError::new(format!("file {}", dir.display()), error));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        // Editors' swap and backup files, and dot-directories (e.g. the
        // `..data` links of a mounted ConfigMap point at the same files).
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            walk_yaml(&path, visit, errors, seen);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            visit(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLUGIN: &str =
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata: {name: p}\nspec: {source: {file: p.wasm}}\n";
    const ROUTE: &str = "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {name: r}\nspec: {models: [m], backends: [{url: 'http://127.0.0.1:1/v1'}], plugins: [{name: p}]}\n";

    /// A directory linked into itself is read once, not until the stack
    /// overflows.
    #[cfg(unix)]
    #[test]
    fn a_symlink_loop_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("r.yaml"), ROUTE.replace("plugins: [{name: p}]", "plugins: []")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("again")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("..", dir.path().join("sub/up")).unwrap();
        let (update, _) = read_dir(dir.path());
        let ConfigUpdate::Desired(desired) = update else { panic!("expected a valid config: {update:?}") };
        assert_eq!(desired.routes.len(), 1);
    }

    #[test]
    fn reads_nested_files_and_resolves_paths_per_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/plugin.yaml"), PLUGIN).unwrap();
        std::fs::write(dir.path().join("route.yml"), ROUTE).unwrap();
        std::fs::write(dir.path().join(".route.yml.swp"), "garbage: [").unwrap();
        let (ConfigUpdate::Desired(desired), _) = read_dir(dir.path()) else { panic!("expected a valid config") };
        assert_eq!(desired.routes.len(), 1);
        assert_eq!(desired.plugins[0].source, PluginSource::File(dir.path().join("sub/p.wasm")));
    }

    #[test]
    fn endpoints_are_read_from_routes_and_plugins_and_unknown_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = PLUGIN.replace("spec: {", "spec: {endpoints: [/v1/chat/completions], ");
        let route = ROUTE.replace("spec: {", "spec: {endpoints: [/v1/responses, /v1/chat/completions], ");
        std::fs::write(dir.path().join("plugin.yaml"), plugin).unwrap();
        std::fs::write(dir.path().join("route.yaml"), &route).unwrap();
        let (ConfigUpdate::Desired(desired), _) = read_dir(dir.path()) else { panic!("expected a valid config") };
        let paths = |e: sluice_core::config::Endpoints| e.paths().collect::<Vec<_>>();
        assert_eq!(paths(desired.plugins[0].endpoints), ["/v1/chat/completions"]);
        assert_eq!(paths(desired.routes[0].endpoints), ["/v1/chat/completions", "/v1/responses"]);

        std::fs::write(dir.path().join("route.yaml"), route.replace("/v1/responses", "/v1/models")).unwrap();
        let (ConfigUpdate::Invalid(errors), _) = read_dir(dir.path()) else { panic!("expected errors") };
        assert!(errors[0].message.contains("/v1/models"), "{errors:?}");
        std::fs::write(dir.path().join("route.yaml"), ROUTE.replace("spec: {", "spec: {endpoints: [], ")).unwrap();
        let (ConfigUpdate::Invalid(errors), _) = read_dir(dir.path()) else { panic!("expected errors") };
        assert!(errors[0].message.contains("endpoints"), "{errors:?}");
    }

    const MCP: &str = "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {name: NAME}\nspec: {path: /mcp, servers: [{name: s, url: 'http://127.0.0.1:1/mcp', apiKeyFile: key}], plugins: [{name: p}]}\n";

    /// MCPRoutes are read as routes are: paths relative to their file, and
    /// in file order, which is the precedence when two claim one path (the
    /// gateway serves the first).
    #[test]
    fn mcp_routes_are_read_in_file_order_with_paths_per_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("a.yaml"), MCP.replace("NAME", "first")).unwrap();
        std::fs::write(dir.path().join("b/m.yaml"), MCP.replace("NAME", "second")).unwrap();
        let (ConfigUpdate::Desired(desired), _) = read_dir(dir.path()) else { panic!("expected a valid config") };
        let names: Vec<&str> = desired.mcp_routes.iter().map(|r| r.key.name.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        let server = &desired.mcp_routes[1].servers[0];
        assert_eq!(server.api_key, Some(sluice_core::ApiKeySource::File(dir.path().join("b/key"))));
        let conflicts = desired.mcp_conflicts();
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(conflicts[0].resource, "MCPRoute default/second");
    }

    /// A bad MCPRoute fails the update as a bad AIModelRoute does, named by
    /// file and route; so does a Secret reference, which files cannot have.
    #[test]
    fn a_bad_mcp_route_invalidates_the_update_and_is_named() {
        for (from, to, expected) in [
            ("path: /mcp", "path: /v1/mcp", "/v1/mcp"),
            ("name: s,", "name: S,", "server name `S`"),
            ("apiKeyFile: key", "apiKeySecretRef: {name: k, key: t}", "refers to Secret `k`"),
            ("plugins:", "plugin:", "plugin"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
            std::fs::write(dir.path().join("mcp.yaml"), MCP.replace("NAME", "m").replace(from, to)).unwrap();
            let (ConfigUpdate::Invalid(errors), _) = read_dir(dir.path()) else { panic!("{to}: expected errors") };
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].resource.ends_with("mcp.yaml"), "{errors:?}");
            assert!(errors[0].message.contains("MCPRoute") && errors[0].message.contains(expected), "{errors:?}");
        }
    }

    #[test]
    fn one_bad_file_invalidates_the_update_and_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plugin.yaml"), PLUGIN).unwrap();
        std::fs::write(dir.path().join("route.yaml"), "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nspec: [")
            .unwrap();
        let (ConfigUpdate::Invalid(errors), _) = read_dir(dir.path()) else { panic!("expected errors") };
        assert_eq!(errors.len(), 1);
        assert!(errors[0].resource.ends_with("route.yaml"), "{errors:?}");
    }

    #[test]
    fn fingerprint_changes_with_content_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
        let (_, a) = read_dir(dir.path());
        let (_, b) = read_dir(dir.path());
        assert_eq!(a, b);
        std::fs::write(dir.path().join("route.yaml"), ROUTE.replace("[m]", "[m2]")).unwrap();
        let (_, c) = read_dir(dir.path());
        assert_ne!(a, c);
    }

    /// An idle poll only stats the files, so thousands of routes cost little
    /// while nothing changes; anything that changes a file or the set of
    /// files, or a plugin file, changes what it compares.
    #[test]
    fn the_stat_fingerprint_moves_with_any_file_change() {
        let dir = tempfile::tempdir().unwrap();
        let route = dir.path().join("route.yaml");
        let plugin = dir.path().join("p.wasm");
        std::fs::write(&route, ROUTE).unwrap();
        std::fs::write(&plugin, b"\0asm").unwrap();
        let stat = || stat_fingerprint(dir.path(), std::slice::from_ref(&plugin));
        let first = stat();
        assert_eq!(first, stat(), "nothing changed");

        std::fs::write(&route, ROUTE.replace("[m]", "[x]")).unwrap();
        let rewritten = stat();
        assert_ne!(first, rewritten, "same size, rewritten in place");
        std::fs::write(dir.path().join("more.yml"), ROUTE).unwrap();
        let added = stat();
        assert_ne!(rewritten, added, "a file added");
        std::fs::write(&plugin, b"\0asm\x01").unwrap();
        assert_ne!(added, stat(), "a plugin file rebuilt");
        let (update, _) = read_dir(dir.path());
        assert_eq!(plugin_files_of(&update), Vec::<PathBuf>::new(), "no plugin declared in these files");
    }

    /// The watcher reports the source's own reads, which would make every
    /// read cause the next one; only writes, creations, renames, removals
    /// and attribute changes are changes.
    #[test]
    fn our_own_reads_are_not_changes() {
        use notify::event::{CreateKind, ModifyKind};
        assert!(!changes_files(&EventKind::Access(AccessKind::Open(AccessMode::Any))));
        assert!(!changes_files(&EventKind::Access(AccessKind::Close(AccessMode::Read))));
        assert!(!changes_files(&EventKind::Access(AccessKind::Read)));
        assert!(changes_files(&EventKind::Access(AccessKind::Close(AccessMode::Write))));
        assert!(changes_files(&EventKind::Modify(ModifyKind::Any)));
        assert!(changes_files(&EventKind::Create(CreateKind::File)));
    }
}
