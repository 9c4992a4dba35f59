use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as StatusCondition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_core::mcp::{check_path, check_server_name};
use sluice_core::{McpAuthorization, McpLimits, McpRouteDecl, McpServerDecl, ResourceKey};

use crate::route::{BackendTlsSpec, PluginRefSpec, api_key_source, tls_decl};
use crate::{ReplicaStatus, SecretKeySelector};

/// Model Context Protocol servers behind one path of the gateway: their
/// tools, prompts and resources merged under each server's name, with a
/// plugin chain on every call.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "MCPRoute",
    doc = "Model Context Protocol servers behind one path of the gateway: their tools, prompts and resources merged under each server's name, with a plugin chain on every call.",
    namespaced,
    status = "MCPRouteStatus",
    shortname = "mcpr",
    category = "sluice",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Path","type":"string","jsonPath":".spec.path"}"#,
    printcolumn = r#"{"name":"Servers","type":"string","jsonPath":".spec.servers[*].name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MCPRouteSpec {
    /// Where the route is served on the gateway's listener, e.g.
    /// `/mcp/github`: absolute, without a trailing slash, of segments of
    /// letters, digits and `-._~` (no `.` or `..`), and not under `/v1` or
    /// `/.well-known/`, which the gateway serves itself. A namespace may
    /// claim only the paths the gateway grants it (`--mcp-path-claim`; by
    /// default the gateway's own namespace claims every path, and no other
    /// namespace any), and of two MCPRoutes claiming one path the older
    /// serves it.
    #[schemars(length(min = 2, max = 256), regex(pattern = r"^(/[A-Za-z0-9._~-]+)+$"))]
    // The pattern cannot say "no `.` or `..` segment" (RE2 has no
    // lookahead): CEL does, within its budget for a string this short.
    #[x_kube(
        validation = Rule::new("!self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..')")
            .message("path has a `.` or `..` segment"),
        validation = Rule::new("self != '/v1' && !self.startsWith('/v1/') && !self.startsWith('/.well-known/')")
            .message("path is the gateway's own (under /v1 or /.well-known)")
    )]
    pub path: String,
    /// The upstream MCP servers (Streamable HTTP), each under a name of its
    /// own: a server's tools, prompts and resources are listed as
    /// `<name>__<tool>`, so several servers appear as one.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(s, self.exists_one(t, t.name == s.name))")
        .message("two servers have the same name"))]
    pub servers: Vec<McpServerSpec>,
    /// Which tools are listed and may be called, by their prefixed names
    /// (default: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<McpToolsSpec>,
    /// The plugin chain, in order: GatewayPlugins in this route's namespace,
    /// run on every call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub plugins: Vec<PluginRefSpec>,
    /// Bounds on what clients and servers may send through the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<McpLimitsSpec>,
    /// The OAuth authorization servers clients get their tokens from,
    /// published as Protected Resource Metadata (RFC 9728) and named in the
    /// `WWW-Authenticate` of a 401. Tokens are checked by the route's plugins
    /// (an auth plugin), not by this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<McpAuthorizationSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new(
    "(has(self.apiKeyEnv) ? 1 : 0) + (has(self.apiKeyFile) ? 1 : 0) + (has(self.apiKeySecretRef) ? 1 : 0) <= 1"
).message("set at most one of apiKeyEnv, apiKeyFile and apiKeySecretRef"))]
#[x_kube(validation = Rule::new("!has(self.tls) || self.url.startsWith('https://')")
    .message("tls applies to https:// servers only"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServerSpec {
    /// The server's name in the route, unique there: a DNS label starting
    /// with a letter (so `<name>__<tool>` splits at the first `__`).
    #[schemars(length(min = 1, max = 63), regex(pattern = "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// The server's Streamable HTTP endpoint, e.g. `http://github-mcp:8000/mcp`.
    #[schemars(length(max = 2048), regex(pattern = "^https?://[^/?#]"))]
    pub url: String,
    /// Environment variable of the gateway holding the server's API key,
    /// sent as `Authorization: Bearer`. For standalone mode: in Kubernetes
    /// only the variables the gateway's operator allows (`--allow-host-env`)
    /// are accepted; use `apiKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub api_key_env: Option<String>,
    /// File holding the server's API key, relative to the YAML file. For
    /// standalone mode: in Kubernetes only an absolute path in a directory
    /// the gateway's operator allows (`--allow-host-files-under`) is
    /// accepted; use `apiKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("apiKeyFile must be an absolute path in Kubernetes"))]
    pub api_key_file: Option<String>,
    /// Secret key holding the server's API key (Kubernetes), in the route's
    /// namespace. A rotated Secret is picked up without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
    /// How long a request may wait for the server's response head, in
    /// milliseconds (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub timeout_ms: Option<u64>,
    /// How the server's certificate is verified and the gateway's own
    /// presented (https:// URLs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTlsSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpToolsSpec {
    /// Globs over the prefixed names (`github__*`, `*__read_*`; `*` matches
    /// any run of characters): a tool is listed and may be called if it
    /// matches one of them. Empty: every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub allow: Vec<String>,
    /// Globs over the prefixed names: a tool matching one is neither listed
    /// nor callable, whatever `allow` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub deny: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpLimitsSpec {
    /// The largest JSON-RPC message accepted from a client or a server (one
    /// JSON body, or one SSE event's data), in bytes (default 4194304).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 67_108_864))]
    pub max_message_bytes: Option<u64>,
    /// The most tools (prompts, resources) one merged listing holds
    /// (default 1024); past it, a server's listing is cut and the cut logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16384))]
    pub max_tools: Option<u32>,
    /// Server-to-client streams one session may hold open at once (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub max_streams_per_session: Option<u32>,
    /// A stream on which a server sends nothing for this long is ended, in
    /// milliseconds (default 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 86_400_000))]
    pub stream_idle_timeout_ms: Option<u64>,
    /// How long a session id is honoured after it was minted, in seconds
    /// (default 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 2_592_000))]
    pub session_ttl_seconds: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpAuthorizationSpec {
    /// The authorization servers' issuer URLs.
    #[schemars(length(min = 1, max = 8), inner(length(max = 2048), regex(pattern = r#"^https?://[^\s"]+$"#)))]
    pub authorization_servers: Vec<String>,
    /// The scopes a client may ask for (OAuth scope tokens: printable
    /// ASCII without spaces, `"` or `\`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256), regex(pattern = r"^[!#-\[\]-~]+$")))]
    pub scopes: Vec<String>,
    /// The resource identifier clients name in their token requests
    /// (default: the route's URL, from the request's scheme and host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r#"^https?://[^\s"]+$"#))]
    pub resource: Option<String>,
}

/// Observed state of an MCPRoute, written by the gateway replica that holds
/// the leader Lease from every replica's load report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MCPRouteStatus {
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (valid, and its path not taken by an older MCPRoute),
    /// `ResolvedRefs` (its plugins and Secrets exist) and `Ready` (every
    /// gateway replica serves this generation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<StatusCondition>,
    /// Gateway replicas serving this generation, out of the live replicas: `2/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded: Option<String>,
    /// Each live gateway replica's view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaStatus>,
}

impl MCPRoute {
    /// Names of the Secrets this route reads, in its namespace.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        let servers = &self.spec.servers;
        let keys = servers.iter().filter_map(|s| s.api_key_secret_ref.as_ref()).map(|r| r.name.as_str());
        let tls = servers.iter().filter_map(|s| s.tls.as_ref()?.secret_ref.as_ref()).map(|r| r.name.as_str());
        keys.chain(tls)
    }

    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(crate::namespace_or_default(&self.metadata), self.metadata.name.clone().unwrap_or_default())
    }

    /// The declaration, files relative to `base_dir` (standalone mode).
    /// Checks what the CRD's schema checks too, since files have no schema.
    pub fn decl(&self, base_dir: &std::path::Path) -> Result<McpRouteDecl, String> {
        let spec = &self.spec;
        check_path(&spec.path).map_err(|e| format!("spec.{e}"))?;
        if spec.servers.is_empty() || spec.servers.len() > 16 {
            return Err(format!("spec.servers has {} entries: from 1 to 16", spec.servers.len()));
        }
        let mut route = McpRouteDecl::new(self.key(), spec.path.clone());
        for (i, server) in spec.servers.iter().enumerate() {
            let decl = server_decl(server, base_dir).map_err(|e| format!("spec.servers[{i}]: {e}"))?;
            route.servers.push(decl);
        }
        if let Some(tools) = &spec.tools {
            for (field, globs) in [("allow", &tools.allow), ("deny", &tools.deny)] {
                if globs.len() > 256 {
                    return Err(format!("spec.tools.{field} has {} globs: at most 256", globs.len()));
                }
                if let Some(bad) = globs.iter().find(|g| g.is_empty() || g.len() > 256) {
                    return Err(format!("spec.tools.{field}: glob `{bad}` must be 1 to 256 characters"));
                }
            }
            route.allow = tools.allow.clone();
            route.deny = tools.deny.clone();
        }
        route.plugins =
            spec.plugins.iter().map(|p| ResourceKey::new(route.key.namespace.clone(), p.name.clone())).collect();
        if let Some(limits) = &spec.limits {
            route.limits = limits_decl(limits);
        }
        if let Some(authorization) = &spec.authorization {
            route.authorization = Some(authorization_decl(authorization)?);
        }
        route.check()?;
        Ok(route)
    }
}

fn server_decl(spec: &McpServerSpec, base_dir: &std::path::Path) -> Result<McpServerDecl, String> {
    check_server_name(&spec.name)?;
    let host = spec.url.strip_prefix("http://").or_else(|| spec.url.strip_prefix("https://"));
    if host.is_none_or(|host| host.is_empty() || host.starts_with(['/', '?', '#'])) {
        return Err(format!("url `{}` must start with http:// or https:// and a host", spec.url));
    }
    if spec.url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("url `{}` has a space or control character", spec.url.escape_debug()));
    }
    let api_key = api_key_source(
        spec.api_key_env.as_deref(),
        spec.api_key_file.as_deref(),
        spec.api_key_secret_ref.is_some(),
        base_dir,
    )
    .map_err(|e| format!("the server {e}"))?;
    let tls = match &spec.tls {
        Some(_) if !spec.url.starts_with("https://") => {
            return Err(format!("server `{}` sets `tls` but is not an https:// URL", spec.name));
        }
        Some(tls) => Some(tls_decl(tls, base_dir)?),
        None => None,
    };
    Ok(McpServerDecl {
        name: spec.name.clone(),
        url: spec.url.clone(),
        api_key,
        timeout: spec
            .timeout_ms
            .map(|ms| Duration::from_millis(ms.max(1)))
            .unwrap_or(McpRouteDecl::DEFAULT_SERVER_TIMEOUT),
        tls,
    })
}

fn limits_decl(spec: &McpLimitsSpec) -> McpLimits {
    let defaults = McpLimits::default();
    // The schema's minimums; a file has no schema, and a zero would serve nothing.
    let at_least = |value: Option<u64>, min: u64| value.map(|v| v.max(min));
    McpLimits {
        max_message_bytes: at_least(spec.max_message_bytes, 1024)
            .map_or(defaults.max_message_bytes, |v| usize::try_from(v).unwrap_or(usize::MAX)),
        max_tools: spec.max_tools.map_or(defaults.max_tools, |v| v.max(1) as usize),
        max_streams_per_session: spec
            .max_streams_per_session
            .map_or(defaults.max_streams_per_session, |v| v.max(1) as usize),
        stream_idle_timeout: at_least(spec.stream_idle_timeout_ms, 1000)
            .map_or(defaults.stream_idle_timeout, Duration::from_millis),
        session_ttl: at_least(spec.session_ttl_seconds, 60).map_or(defaults.session_ttl, Duration::from_secs),
    }
}

fn authorization_decl(spec: &McpAuthorizationSpec) -> Result<McpAuthorization, String> {
    let count = spec.authorization_servers.len();
    if !(1..=8).contains(&count) {
        return Err(format!("spec.authorization.authorizationServers has {count} entries: from 1 to 8"));
    }
    // These go into JSON and into a `WWW-Authenticate` header: nothing that
    // could end a quoted string or a header.
    let url = |field: &str, url: &str| {
        let plain = (url.starts_with("https://") || url.starts_with("http://"))
            && url.len() <= 2048
            && !url.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\');
        if plain { Ok(url.to_string()) } else { Err(format!("spec.authorization.{field}: `{url}` is not a URL")) }
    };
    let authorization_servers =
        spec.authorization_servers.iter().map(|u| url("authorizationServers", u)).collect::<Result<_, _>>()?;
    if spec.scopes.len() > 64 {
        return Err(format!("spec.authorization.scopes has {} entries: at most 64", spec.scopes.len()));
    }
    if let Some(bad) = spec.scopes.iter().find(|scope| {
        scope.is_empty()
            || scope.len() > 256
            || !scope.bytes().all(|b| b == b'!' || ((b'#'..=b'~').contains(&b) && b != b'\\'))
    }) {
        return Err(format!("spec.authorization.scopes: `{}` is not an OAuth scope token", bad.escape_debug()));
    }
    let resource = spec.resource.as_deref().map(|r| url("resource", r)).transpose()?;
    Ok(McpAuthorization { authorization_servers, scopes: spec.scopes.clone(), resource })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{Document, parse_documents};

    const ROUTE: &str = r#"
apiVersion: sluice.dev/v1alpha1
kind: MCPRoute
metadata: {name: tools, namespace: team}
spec:
  path: /mcp/tools
  servers:
  - name: github
    url: "https://github-mcp.example:8443/mcp"
    apiKeyFile: keys/github
    timeoutMs: 5000
    tls: {caFile: ca.pem, serverName: github.internal}
  - name: weather
    url: "http://127.0.0.1:9000/mcp"
    apiKeyEnv: WEATHER_KEY
  tools:
    allow: ["github__*", "weather__get_*"]
    deny: ["*__delete_*"]
  plugins: [{name: auth}, {name: audit}]
  limits: {maxMessageBytes: 65536, maxTools: 50, maxStreamsPerSession: 2, streamIdleTimeoutMs: 30000, sessionTtlSeconds: 3600}
  authorization:
    authorizationServers: ["https://login.example.com"]
    scopes: [tools.read, "tools:write"]
    resource: "https://gateway.example.com/mcp/tools"
"#;

    fn parse(text: &str) -> Result<MCPRoute, String> {
        match parse_documents(text).remove(0) {
            Ok(Document::McpRoute(route)) => Ok(route),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.message),
        }
    }

    fn decl(text: &str) -> Result<McpRouteDecl, String> {
        parse(text)?.decl(Path::new("/etc/sluice"))
    }

    #[test]
    fn every_field_reaches_the_declaration() {
        let route = decl(ROUTE).unwrap();
        assert_eq!(route.key, ResourceKey::new("team", "tools"));
        assert_eq!(route.path, "/mcp/tools");
        let [github, weather] = route.servers.as_slice() else { panic!("{:?}", route.servers) };
        assert_eq!((github.name.as_str(), github.url.as_str()), ("github", "https://github-mcp.example:8443/mcp"));
        assert_eq!(github.api_key, Some(sluice_core::ApiKeySource::File("/etc/sluice/keys/github".into())));
        assert_eq!(github.timeout, Duration::from_secs(5));
        let tls = github.tls.as_ref().unwrap();
        assert_eq!(tls.ca, Some(sluice_core::Pem::File("/etc/sluice/ca.pem".into())));
        assert_eq!(tls.server_name.as_deref(), Some("github.internal"));
        assert_eq!(weather.api_key, Some(sluice_core::ApiKeySource::Env("WEATHER_KEY".into())));
        assert_eq!(weather.timeout, McpRouteDecl::DEFAULT_SERVER_TIMEOUT);
        assert!(weather.tls.is_none());
        assert_eq!(route.allow, ["github__*", "weather__get_*"]);
        assert_eq!(route.deny, ["*__delete_*"]);
        assert!(route.allows("weather__get_forecast") && !route.allows("github__delete_repo"));
        let plugins: Vec<String> = route.plugins.iter().map(ToString::to_string).collect();
        assert_eq!(plugins, ["team/auth", "team/audit"]);
        assert_eq!(
            route.limits,
            McpLimits {
                max_message_bytes: 65536,
                max_tools: 50,
                max_streams_per_session: 2,
                stream_idle_timeout: Duration::from_secs(30),
                session_ttl: Duration::from_secs(3600),
            }
        );
        let authorization = route.authorization.unwrap();
        assert_eq!(authorization.authorization_servers, ["https://login.example.com"]);
        assert_eq!(authorization.scopes, ["tools.read", "tools:write"]);
        assert_eq!(authorization.resource.as_deref(), Some("https://gateway.example.com/mcp/tools"));
    }

    #[test]
    fn what_is_left_out_takes_the_core_defaults() {
        let text = "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {name: m}\n\
                    spec: {path: /mcp, servers: [{name: s, url: 'http://s:1/mcp'}]}\n";
        let route = decl(text).unwrap();
        assert_eq!(route.key.to_string(), "default/m");
        assert_eq!(route.limits, McpLimits::default());
        assert!(route.allow.is_empty() && route.deny.is_empty() && route.plugins.is_empty());
        assert!(route.authorization.is_none());
        assert_eq!(route.servers[0].api_key, None);
        // Some limits given: the others keep their defaults.
        let text = text.replace("spec: {", "spec: {limits: {maxTools: 3}, ");
        let limits = decl(&text).unwrap().limits;
        assert_eq!((limits.max_tools, limits.session_ttl), (3, McpLimits::default().session_ttl));
    }

    #[test]
    fn a_typo_in_a_field_is_an_error_not_a_silent_default() {
        for (right, wrong) in
            [("timeoutMs", "timeoutMS"), ("maxTools", "maxTool"), ("deny:", "denny:"), ("scopes", "scope")]
        {
            let error = parse(&ROUTE.replace(right, wrong)).unwrap_err();
            assert!(error.contains(wrong.trim_end_matches(':')), "{right}: {error}");
        }
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["/", "mcp", "/mcp/", "/a//b", "/a/../b", "/v1/mcp", "/.well-known/x", "/a b"] {
            let text = ROUTE.replace("path: /mcp/tools", &format!("path: '{bad}'"));
            let error = decl(&text).unwrap_err();
            assert!(error.contains("path"), "{bad}: {error}");
        }
    }

    #[test]
    fn bad_and_repeated_server_names_are_refused() {
        for bad in ["GitHub", "2fa", "a_b", "a__b", "x-", ""] {
            let text = ROUTE.replace("name: weather", &format!("name: '{bad}'"));
            let error = decl(&text).unwrap_err();
            assert!(error.contains("server name"), "{bad}: {error}");
        }
        let error = decl(&ROUTE.replace("name: weather", "name: github")).unwrap_err();
        assert!(error.contains("`github` is used twice"), "{error}");
    }

    #[test]
    fn bad_servers_and_authorization_are_refused_by_name() {
        let cases = [
            ("url: \"http://127.0.0.1:9000/mcp\"", "url: \"ftp://x/mcp\"", "http:// or https://"),
            ("url: \"http://127.0.0.1:9000/mcp\"", "url: \"http:///mcp\"", "a host"),
            ("apiKeyEnv: WEATHER_KEY", "apiKeyEnv: W\n    apiKeyFile: k", "more than one of apiKeyEnv"),
            ("url: \"https://github-mcp.example:8443/mcp\"", "url: \"http://github-mcp.example/mcp\"", "`tls`"),
            ("serverName: github.internal", "serverName: 'bad name'", "tls.serverName"),
            ("[\"https://login.example.com\"]", "[]", "authorizationServers"),
            ("[\"https://login.example.com\"]", "[\"login.example.com\"]", "authorizationServers"),
            ("tools.read", "'tools read'", "scope"),
            ("tools.read", "'a\"b'", "scope"),
        ];
        for (from, to, expected) in cases {
            assert!(ROUTE.contains(from), "{from}");
            let error = decl(&ROUTE.replace(from, to)).unwrap_err();
            assert!(error.contains(expected), "{to}: {error}");
        }
        let none =
            "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {name: m}\nspec: {path: /mcp, servers: []}\n";
        assert!(decl(none).unwrap_err().contains("spec.servers"));
    }

    #[test]
    fn secret_names_are_the_api_keys_and_tls_secrets() {
        let text = ROUTE
            .replace("apiKeyEnv: WEATHER_KEY", "apiKeySecretRef: {name: weather-key, key: token}")
            .replace("tls: {caFile: ca.pem, serverName: github.internal}", "tls: {secretRef: {name: github-tls}}");
        let route = parse(&text).unwrap();
        let names: Vec<&str> = route.secret_names().collect();
        assert_eq!(names, ["weather-key", "github-tls"]);
        // The controller fills in what the Secrets hold.
        let decl = route.decl(Path::new("/")).unwrap();
        assert_eq!(decl.servers[1].api_key, None);
        assert_eq!(decl.servers[0].tls.as_ref().unwrap().ca, None);
    }

    /// The schema's bounds, which the API server enforces (files have none:
    /// `decl` checks them).
    #[test]
    fn the_crd_bounds_every_list_and_names_its_rules() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(MCPRoute::crd()).unwrap();
        assert_eq!(crd["spec"]["names"]["plural"], "mcproutes");
        assert_eq!(crd["spec"]["names"]["shortNames"], serde_json::json!(["mcpr"]));
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let version = &crd["spec"]["versions"][0];
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Ready", "Path", "Servers", "Age"]);
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["path", "servers"]));
        let props = &spec["properties"];
        assert_eq!((&props["servers"]["minItems"], &props["servers"]["maxItems"]), (&1.into(), &16.into()));
        let server = &props["servers"]["items"]["properties"];
        assert_eq!(server["name"]["pattern"], "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$");
        assert_eq!(props["tools"]["properties"]["allow"]["maxItems"], 256);
        assert_eq!(props["tools"]["properties"]["deny"]["items"]["maxLength"], 256);
        assert_eq!(props["authorization"]["properties"]["authorizationServers"]["maxItems"], 8);
        assert_eq!(props["path"]["maxLength"], 256);
        let rules = props["path"]["x-kubernetes-validations"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
    }
}
