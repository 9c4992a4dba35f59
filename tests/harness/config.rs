//! A config directory the gateway watches, and the YAML the tests put in it.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tempfile::TempDir;

/// A temporary directory of GatewayPlugin and AIModelRoute YAML.
pub struct ConfigDir {
    dir: TempDir,
}

impl ConfigDir {
    pub fn new() -> ConfigDir {
        ConfigDir {
            dir: tempfile::Builder::new().prefix("sluice-e2e-config").tempdir().expect("creating a config dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `name` atomically, so the gateway never reads half a file. The
    /// temporary name starts with a dot, which the gateway skips.
    pub fn write(&self, name: &str, yaml: &str) {
        let partial = self.dir.path().join(format!(".{name}.partial"));
        std::fs::write(&partial, yaml).unwrap_or_else(|e| panic!("writing {}: {e}", partial.display()));
        std::fs::rename(&partial, self.file(name)).unwrap_or_else(|e| panic!("renaming into {name}: {e}"));
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.file(name)).unwrap_or_else(|e| panic!("removing {name}: {e}"));
    }
}

impl Default for ConfigDir {
    fn default() -> Self {
        Self::new()
    }
}

/// A GatewayPlugin loading plugins/dist/<wasm>.wasm by absolute path.
#[derive(Clone, Debug)]
pub struct Plugin {
    name: String,
    /// A `.wasm` path, or with `oci`, a reference.
    file: PathBuf,
    oci: Option<(String, Option<String>)>,
    config: Option<Value>,
    open: bool,
    timeout_ms: Option<u32>,
    max_memory_mib: Option<u32>,
    sha256: Option<String>,
    reused: Option<u32>,
    auth_phase: bool,
    endpoints: Option<Vec<String>>,
    state: Option<Value>,
    egress: Option<Value>,
}

impl Plugin {
    pub fn new(name: &str, wasm: &str) -> Plugin {
        Plugin {
            name: name.to_string(),
            file: crate::plugin_wasm(wasm),
            oci: None,
            config: None,
            open: false,
            timeout_ms: None,
            max_memory_mib: None,
            sha256: None,
            reused: None,
            auth_phase: false,
            endpoints: None,
            state: None,
            egress: None,
        }
    }

    /// A GatewayPlugin whose `source.file` is `path`.
    pub fn at(name: &str, path: PathBuf) -> Plugin {
        Plugin { file: path, ..Plugin::new(name, "add-header") }
    }

    /// A GatewayPlugin whose `source.oci` is `reference`.
    pub fn oci(name: &str, reference: &str) -> Plugin {
        Plugin { oci: Some((reference.to_string(), None)), ..Plugin::new(name, "add-header") }
    }

    /// `source.pullPolicy` of an OCI plugin.
    pub fn pull_policy(mut self, policy: &str) -> Plugin {
        if let Some((_, pull_policy)) = &mut self.oci {
            *pull_policy = Some(policy.to_string());
        }
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(mut self, config: Value) -> Plugin {
        self.config = Some(config);
        self
    }

    /// `failurePolicy: Open`; the default is Closed.
    pub fn fail_open(mut self) -> Plugin {
        self.open = true;
        self
    }

    pub fn timeout_ms(mut self, ms: u32) -> Plugin {
        self.timeout_ms = Some(ms);
        self
    }

    pub fn max_memory_mib(mut self, mib: u32) -> Plugin {
        self.max_memory_mib = Some(mib);
        self
    }

    /// Pins the module's sha256 (64 hex digits, no `sha256:` prefix).
    pub fn sha256(mut self, hex: &str) -> Plugin {
        self.sha256 = Some(hex.to_string());
        self
    }

    /// `phase: Auth`: runs before the rest of the chain, and before routing.
    pub fn auth_phase(mut self) -> Plugin {
        self.auth_phase = true;
        self
    }

    /// `endpoints`: the forwarded endpoints the plugin understands.
    pub fn endpoints(mut self, paths: &[&str]) -> Plugin {
        self.endpoints = Some(paths.iter().map(|p| p.to_string()).collect());
        self
    }

    /// `state`: grants shared state (`{}`: the gateway's caps).
    pub fn state(mut self, grant: Value) -> Plugin {
        self.state = Some(grant);
        self
    }

    /// `egress`: grants outbound HTTP (`{"destinations": [{"url": ...}]}`).
    pub fn egress(mut self, grant: Value) -> Plugin {
        self.egress = Some(grant);
        self
    }

    /// `isolation: Reused`, keeping at most `max_idle` idle instances.
    pub fn reused(mut self, max_idle: u32) -> Plugin {
        self.reused = Some(max_idle);
        self
    }

    pub fn yaml(&self) -> String {
        // JSON strings and objects are valid YAML flow scalars and mappings.
        let mut spec = match &self.oci {
            None => format!("  source:\n    file: {}\n", Value::from(self.file.to_string_lossy())),
            Some((reference, policy)) => {
                let mut source = format!("  source:\n    oci: {}\n", Value::from(reference.as_str()));
                if let Some(policy) = policy {
                    source += &format!("    pullPolicy: {policy}\n");
                }
                source
            }
        };
        if let Some(config) = &self.config {
            spec += &format!("  config: {config}\n");
        }
        spec += &format!("  failurePolicy: {}\n", if self.open { "Open" } else { "Closed" });
        if self.auth_phase {
            spec += "  phase: Auth\n";
        }
        if let Some(ms) = self.timeout_ms {
            spec += &format!("  timeoutMs: {ms}\n");
        }
        if let Some(mib) = self.max_memory_mib {
            spec += &format!("  maxMemoryMiB: {mib}\n");
        }
        if let Some(hex) = &self.sha256 {
            spec += &format!("  sha256: \"{hex}\"\n");
        }
        if let Some(max_idle) = self.reused {
            spec += &format!("  isolation: Reused\n  maxReusedInstances: {max_idle}\n");
        }
        if let Some(endpoints) = &self.endpoints {
            spec += &format!("  endpoints: {}\n", Value::from(endpoints.clone()));
        }
        if let Some(state) = &self.state {
            spec += &format!("  state: {state}\n");
        }
        if let Some(egress) = &self.egress {
            spec += &format!("  egress: {egress}\n");
        }
        document("GatewayPlugin", &self.name, &spec)
    }
}

/// An AIModelRoute.
#[derive(Clone, Debug)]
pub struct Route {
    name: String,
    models: Vec<String>,
    backends: Vec<Backend>,
    plugins: Vec<String>,
    timeout_ms: Option<u64>,
    endpoints: Option<Vec<String>>,
}

/// One of a route's upstreams.
#[derive(Clone, Debug)]
pub struct Backend {
    url: String,
    name: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
}

impl Backend {
    pub fn new(url: &str) -> Backend {
        Backend { url: url.to_string(), name: None, model: None, api_key_env: None }
    }

    /// Its `name` in the route, which plugins may route to.
    pub fn name(mut self, name: &str) -> Backend {
        self.name = Some(name.to_string());
        self
    }

    /// The model name sent upstream in place of the client's.
    pub fn model(mut self, model: &str) -> Backend {
        self.model = Some(model.to_string());
        self
    }

    pub fn api_key_env(mut self, var: &str) -> Backend {
        self.api_key_env = Some(var.to_string());
        self
    }
}

impl Route {
    /// A route serving `models` from one backend at `url`.
    pub fn new(name: &str, models: &[&str], url: &str) -> Route {
        Route {
            name: name.to_string(),
            models: models.iter().map(|m| m.to_string()).collect(),
            backends: vec![Backend::new(url)],
            plugins: Vec::new(),
            timeout_ms: None,
            endpoints: None,
        }
    }

    /// Replaces the backends.
    pub fn backends(mut self, backends: Vec<Backend>) -> Route {
        self.backends = backends;
        self
    }

    /// The plugin chain, in order.
    pub fn plugins(mut self, names: &[&str]) -> Route {
        self.plugins = names.iter().map(|n| n.to_string()).collect();
        self
    }

    pub fn timeout_ms(mut self, ms: u64) -> Route {
        self.timeout_ms = Some(ms);
        self
    }

    /// `endpoints`: the forwarded endpoints the route serves.
    pub fn endpoints(mut self, paths: &[&str]) -> Route {
        self.endpoints = Some(paths.iter().map(|p| p.to_string()).collect());
        self
    }

    pub fn yaml(&self) -> String {
        let mut spec = format!("  models: {}\n  backends:\n", Value::from(self.models.clone()));
        for backend in &self.backends {
            spec += &format!("    - url: {}\n", Value::from(backend.url.as_str()));
            if let Some(name) = &backend.name {
                spec += &format!("      name: {name}\n");
            }
            if let Some(model) = &backend.model {
                spec += &format!("      model: {}\n", Value::from(model.as_str()));
            }
            if let Some(var) = &backend.api_key_env {
                spec += &format!("      apiKeyEnv: {var}\n");
            }
        }
        if !self.plugins.is_empty() {
            spec += "  plugins:\n";
            for name in &self.plugins {
                spec += &format!("    - name: {name}\n");
            }
        }
        if let Some(ms) = self.timeout_ms {
            spec += &format!("  timeoutMs: {ms}\n");
        }
        if let Some(endpoints) = &self.endpoints {
            spec += &format!("  endpoints: {}\n", Value::from(endpoints.clone()));
        }
        document("AIModelRoute", &self.name, &spec)
    }
}

fn document(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: sluice.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

/// Joins documents into one multi-document YAML file.
pub fn documents(docs: &[String]) -> String {
    docs.join("---\n")
}
