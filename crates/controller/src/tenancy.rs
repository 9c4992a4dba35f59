//! What a resource may ask of the gateway beyond its own namespace's
//! objects: files and environment variables of the gateway's host, and
//! model names and MCP paths, which every namespace shares.
//!
//! A route chooses its backend URL, so whatever key the gateway sends there
//! is its author's to read: a file or variable of the gateway's (its
//! ServiceAccount token) must not be one. And a model (an MCP path) is
//! served by one route, so which namespaces may claim which models (paths)
//! is the operator's decision, as Gateway API leaves to a Gateway's owner which namespaces
//! may attach routes (`allowedRoutes`, by default the Gateway's own) and
//! with which hostnames. Age alone cannot decide it: a squatter's route is
//! the oldest as soon as the owner recreates theirs.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use sluice_core::BackendPolicy;

/// The operator's grants to resources. The default grants nothing beyond
/// the gateway's own namespace claiming every model and every MCP path:
/// safe for a cluster shared by tenants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenancy {
    /// Directories (volumes the operator mounted for it) under which a
    /// GatewayPlugin's `source.file` and an AIModelRoute's `apiKeyFile` may
    /// name files. Empty: neither is accepted.
    pub host_file_dirs: Vec<PathBuf>,
    /// Environment variables of the gateway an AIModelRoute's `apiKeyEnv`
    /// may name. Empty: `apiKeyEnv` is not accepted.
    pub host_env_vars: Vec<String>,
    /// Which namespaces may claim which models. A model goes to the
    /// namespaces of its most specific matching grant (an exact name before
    /// any prefix, a longer prefix before a shorter); the others may not
    /// claim it. Empty: the gateway's own namespace (the watched one, or
    /// else the Leases') may claim every model, and no other namespace any.
    pub model_claims: Vec<ModelClaim>,
    /// Which namespaces may claim which MCP paths. A path goes to the
    /// namespaces of its most specific matching grant (the longest prefix;
    /// `*` last); the others may not claim it. Empty: the gateway's own
    /// namespace may claim every path, and no other namespace any.
    pub mcp_path_claims: Vec<McpPathClaim>,
    /// Namespaces whose GatewayPlugins, when they name no pull Secret of
    /// their own, may pull with the registry credentials the operator gave
    /// the gateway (`--docker-config`, `--credentials-file`). Others pull
    /// anonymously: the operator's account is not every tenant's. Empty:
    /// the gateway's own namespace only.
    pub registry_credential_namespaces: Vec<String>,
    /// What a route's backends may reach: not the gateway's own loopback,
    /// listeners or addresses, nor the cloud metadata service, unless the
    /// operator allows a range (--allow-backend-cidr). A route whose
    /// backend URL names one is not accepted, and its status says why.
    pub backends: BackendPolicy,
}

/// `NAMESPACE=PATTERN`: AIModelRoutes in `namespace` may claim the models
/// `pattern` matches: a model name, or a prefix followed by `*` (`*` alone
/// matches every model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelClaim {
    pub namespace: String,
    pub pattern: String,
}

impl ModelClaim {
    pub fn new(namespace: impl Into<String>, pattern: impl Into<String>) -> Self {
        ModelClaim { namespace: namespace.into(), pattern: pattern.into() }
    }

    /// How closely the pattern matches `model`, if it does: higher is
    /// more specific.
    fn specificity(&self, model: &str) -> Option<usize> {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix).then_some(prefix.len()),
            None => (self.pattern == model).then_some(usize::MAX),
        }
    }
}

impl FromStr for ModelClaim {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let Some((namespace, pattern)) = text.split_once('=') else {
            return Err(format!("`{text}` is not NAMESPACE=PATTERN"));
        };
        if !namespace_name(namespace) {
            return Err(format!("`{namespace}` is not a namespace name"));
        }
        if pattern.is_empty() || pattern.trim_end_matches('*').contains('*') || pattern.ends_with("**") {
            return Err(format!("`{pattern}` is not a model name, or a prefix followed by one `*`"));
        }
        Ok(ModelClaim::new(namespace, pattern))
    }
}

impl fmt::Display for ModelClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.namespace, self.pattern)
    }
}

/// `NAMESPACE=PREFIX`: MCPRoutes in `namespace` may claim the paths
/// `prefix` matches: itself and the paths below it, at a segment boundary
/// (`/mcp/team-a` matches `/mcp/team-a` and `/mcp/team-a/x`, not
/// `/mcp/team-ab`), or every path for `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpPathClaim {
    pub namespace: String,
    pub prefix: String,
}

impl McpPathClaim {
    pub fn new(namespace: impl Into<String>, prefix: impl Into<String>) -> Self {
        McpPathClaim { namespace: namespace.into(), prefix: prefix.into() }
    }

    /// How closely the prefix matches `path`, if it does: higher is more
    /// specific (a longer prefix; `*` least).
    fn specificity(&self, path: &str) -> Option<usize> {
        if self.prefix == "*" {
            return Some(0);
        }
        let below = path.strip_prefix(self.prefix.as_str())?;
        (below.is_empty() || below.starts_with('/')).then_some(self.prefix.len())
    }
}

impl FromStr for McpPathClaim {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let Some((namespace, prefix)) = text.split_once('=') else {
            return Err(format!("`{text}` is not NAMESPACE=PREFIX"));
        };
        if !namespace_name(namespace) {
            return Err(format!("`{namespace}` is not a namespace name"));
        }
        // The paths an MCPRoute may have (core's check_path), but for the
        // gateway's own: a prefix is compared segment by segment.
        let path = prefix.len() > 1
            && prefix.starts_with('/')
            && !prefix.ends_with('/')
            && prefix.split('/').skip(1).all(|segment| {
                !segment.is_empty()
                    && segment != "."
                    && segment != ".."
                    && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
            });
        if prefix != "*" && !path {
            return Err(format!(
                "`{prefix}` is neither `*` nor an absolute path without a trailing slash, of segments of letters, \
                 digits and `-._~`"
            ));
        }
        Ok(McpPathClaim::new(namespace, prefix))
    }
}

impl fmt::Display for McpPathClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.namespace, self.prefix)
    }
}

/// A DNS label, as namespace names are.
fn namespace_name(namespace: &str) -> bool {
    !namespace.is_empty()
        && namespace.len() <= 63
        && namespace.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-')
}

impl Tenancy {
    /// With the default claims filled in: `own_namespace` claims every
    /// model and every MCP path.
    pub(crate) fn resolved(mut self, own_namespace: &str) -> Tenancy {
        if self.model_claims.is_empty() {
            self.model_claims = vec![ModelClaim::new(own_namespace, "*")];
        }
        if self.mcp_path_claims.is_empty() {
            self.mcp_path_claims = vec![McpPathClaim::new(own_namespace, "*")];
        }
        if self.registry_credential_namespaces.is_empty() {
            self.registry_credential_namespaces = vec![own_namespace.to_owned()];
        }
        // Routes' authors are not the operator here, whatever the caller said.
        self.backends.restricted = true;
        self
    }

    /// Plugins in `namespace` may pull with the operator's registry
    /// credentials.
    pub(crate) fn lends_registry_credentials(&self, namespace: &str) -> bool {
        self.registry_credential_namespaces.iter().any(|allowed| allowed == namespace)
    }

    /// `path` (absolute) is in a directory the operator allows.
    pub(crate) fn allows_file(&self, path: &Path) -> bool {
        // `/allowed/../etc` starts with `/allowed`, component by component.
        !path.components().any(|c| c == Component::ParentDir)
            && self.host_file_dirs.iter().any(|dir| path.starts_with(dir))
    }

    pub(crate) fn allows_env(&self, name: &str) -> bool {
        self.host_env_vars.iter().any(|allowed| allowed == name)
    }

    /// Routes in `namespace` may claim `model`.
    pub(crate) fn allows_model(&self, namespace: &str, model: &str) -> bool {
        let best = self.model_claims.iter().filter_map(|c| c.specificity(model)).max();
        best.is_some() && self.model_claims.iter().any(|c| c.namespace == namespace && c.specificity(model) == best)
    }

    /// MCPRoutes in `namespace` may claim `path`.
    pub(crate) fn allows_mcp_path(&self, namespace: &str, path: &str) -> bool {
        let best = self.mcp_path_claims.iter().filter_map(|c| c.specificity(path)).max();
        best.is_some() && self.mcp_path_claims.iter().any(|c| c.namespace == namespace && c.specificity(path) == best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(list: &[&str]) -> Tenancy {
        Tenancy { model_claims: list.iter().map(|c| c.parse().unwrap()).collect(), ..Tenancy::default() }
    }

    #[test]
    fn by_default_only_the_gateways_namespace_claims_models() {
        let tenancy = Tenancy::default().resolved("sluice-system");
        assert!(tenancy.allows_model("sluice-system", "gpt-4o"));
        assert!(!tenancy.allows_model("team-a", "gpt-4o"));
        // Given grants replace the default.
        let tenancy = claims(&["team-a=gpt-*"]).resolved("sluice-system");
        assert!(tenancy.allows_model("team-a", "gpt-4o"));
        assert!(!tenancy.allows_model("sluice-system", "gpt-4o"));
        assert!(!tenancy.allows_model("team-a", "llama3"));
    }

    #[test]
    fn the_most_specific_grant_decides_whose_a_model_is() {
        let tenancy = claims(&["platform=*", "team-a=gpt-4o*", "team-b=gpt-4o-mini", "team-c=gpt-4o-mini"]);
        assert!(tenancy.allows_model("team-a", "gpt-4o") && !tenancy.allows_model("platform", "gpt-4o"));
        assert!(tenancy.allows_model("team-b", "gpt-4o-mini") && tenancy.allows_model("team-c", "gpt-4o-mini"));
        assert!(!tenancy.allows_model("team-a", "gpt-4o-mini"));
        assert!(tenancy.allows_model("platform", "llama3") && !tenancy.allows_model("team-a", "llama3"));
        assert!(!tenancy.allows_model("team-d", "llama3"));
    }

    #[test]
    fn claims_are_namespace_equals_pattern() {
        assert_eq!("team-a=gpt-*".parse(), Ok(ModelClaim::new("team-a", "gpt-*")));
        assert_eq!("team-a=*".parse::<ModelClaim>().unwrap().to_string(), "team-a=*");
        for bad in ["team-a", "=gpt", "team-a=", "Team=gpt", "-team=gpt", "team-a=g*t", "team-a=**", "team/a=gpt"] {
            assert!(bad.parse::<ModelClaim>().is_err(), "{bad}");
        }
    }

    fn path_claims(list: &[&str]) -> Tenancy {
        Tenancy { mcp_path_claims: list.iter().map(|c| c.parse().unwrap()).collect(), ..Tenancy::default() }
    }

    #[test]
    fn by_default_only_the_gateways_namespace_claims_mcp_paths() {
        let tenancy = Tenancy::default().resolved("sluice-system");
        assert!(tenancy.allows_mcp_path("sluice-system", "/mcp"));
        assert!(tenancy.allows_mcp_path("sluice-system", "/tools/github"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp"));
        // Given grants replace the default (of paths only: models keep theirs).
        let tenancy = path_claims(&["team-a=/mcp/team-a"]).resolved("sluice-system");
        assert!(tenancy.allows_mcp_path("team-a", "/mcp/team-a"));
        assert!(!tenancy.allows_mcp_path("sluice-system", "/mcp/team-a"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp"));
        assert!(!tenancy.allows_mcp_path("sluice-system", "/mcp"));
        assert!(tenancy.allows_model("sluice-system", "gpt-4o"));
    }

    #[test]
    fn a_path_prefix_matches_at_segment_boundaries_only() {
        let tenancy = path_claims(&["team-a=/mcp/team-a"]);
        assert!(tenancy.allows_mcp_path("team-a", "/mcp/team-a"));
        assert!(tenancy.allows_mcp_path("team-a", "/mcp/team-a/x"));
        assert!(tenancy.allows_mcp_path("team-a", "/mcp/team-a/x/y"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp/team-ab"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp/team"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp"));
    }

    #[test]
    fn the_longest_matching_prefix_decides_whose_a_path_is() {
        let tenancy = path_claims(&[
            "platform=*",
            "team-a=/mcp/team-a",
            "team-b=/mcp/team-a/shared",
            "team-c=/mcp/team-a/shared",
        ]);
        assert!(
            tenancy.allows_mcp_path("team-a", "/mcp/team-a/x") && !tenancy.allows_mcp_path("platform", "/mcp/team-a/x")
        );
        assert!(tenancy.allows_mcp_path("team-b", "/mcp/team-a/shared/x"));
        assert!(tenancy.allows_mcp_path("team-c", "/mcp/team-a/shared"));
        assert!(!tenancy.allows_mcp_path("team-a", "/mcp/team-a/shared"));
        assert!(tenancy.allows_mcp_path("team-a", "/mcp/team-a/shared-not"));
        assert!(
            tenancy.allows_mcp_path("platform", "/mcp/team-ab") && !tenancy.allows_mcp_path("team-a", "/mcp/team-ab")
        );
        assert!(!tenancy.allows_mcp_path("team-d", "/mcp"));
        // With no grant matching, no namespace may claim the path.
        let tenancy = path_claims(&["team-a=/mcp/team-a"]);
        assert!(!tenancy.allows_mcp_path("team-a", "/other") && !tenancy.allows_mcp_path("team-b", "/other"));
    }

    #[test]
    fn path_claims_are_namespace_equals_prefix() {
        assert_eq!("team-a=/mcp/team-a".parse(), Ok(McpPathClaim::new("team-a", "/mcp/team-a")));
        assert_eq!("team-a=*".parse::<McpPathClaim>().unwrap().to_string(), "team-a=*");
        assert_eq!("team-a=/mcp".parse::<McpPathClaim>().unwrap().to_string(), "team-a=/mcp");
        for bad in [
            "team-a",
            "=/mcp",
            "team-a=",
            "Team=/mcp",
            "-team=/mcp",
            "team/a=/mcp",
            "team-a=mcp",
            "team-a=/",
            "team-a=/mcp/",
            "team-a=/mcp//x",
            "team-a=/mcp/../x",
            "team-a=/mcp*",
            "team-a=**",
            "team-a=/mcp,/x",
        ] {
            assert!(bad.parse::<McpPathClaim>().is_err(), "{bad}");
        }
    }
}
