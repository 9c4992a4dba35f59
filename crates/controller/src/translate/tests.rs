use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use serde_json::json;

use super::*;

fn secret(name: &str, type_: Option<&str>, data: &[(&str, &str)]) -> Arc<Secret> {
    Arc::new(Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("team".into()),
            ..Default::default()
        },
        type_: type_.map(str::to_string),
        data: Some(
            data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    })
}

fn secrets(list: &[Arc<Secret>]) -> HashMap<(String, String), Arc<Secret>> {
    list.iter().map(|s| (("team".to_string(), s.name_any()), s.clone())).collect()
}

/// The default grants of a gateway in namespace `team`.
fn tenancy() -> Tenancy {
    Tenancy::default().resolved("team")
}

fn gateway_plugin(spec: Value) -> GatewayPlugin {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
        "metadata": {"name": "p", "namespace": "team"}, "spec": spec
    }))
    .unwrap()
}

#[test]
fn config_from_sets_secret_values_at_pointers_and_never_prints_them() {
    let plugin = gateway_plugin(json!({
        "source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "pull"}},
        "config": {"jwt": {"issuer": "me"}},
        "configFrom": [
            {"path": "/jwt/secret", "secretKeyRef": {"name": "s", "key": "hmac"}},
            {"path": "/apiKeys", "secretKeyRef": {"name": "s", "key": "keys"}, "format": "Json"},
            {"path": "/new~1key", "secretKeyRef": {"name": "s", "key": "hmac"}}
        ]
    }));
    let store = secrets(&[
        secret("s", None, &[("hmac", "hunter2"), ("keys", r#"["a","b"]"#)]),
        secret("pull", Some("kubernetes.io/basic-auth"), &[("username", "u"), ("password", "pw")]),
    ]);
    let decl = super::plugin(&plugin, &store, &tenancy()).unwrap();
    assert_eq!(
        decl.config,
        json!({"jwt": {"issuer": "me", "secret": "hunter2"}, "apiKeys": ["a", "b"], "new/key": "hunter2"})
    );
    let PluginSource::Oci { credentials: Some(credentials), .. } = &decl.source else { panic!("{:?}", decl.source) };
    assert!(!format!("{credentials:?}").contains("pw"));
    assert!(
        matches!(credentials, RegistryCredentials::Basic { username, password } if username == "u" && password.expose() == "pw")
    );
}

/// A tenant's plugin that names no pull Secret must not pull with the
/// operator's registry account (a confused deputy: the operator's
/// private repositories would be every tenant's).
#[test]
fn only_namespaces_the_operator_names_pull_with_its_registry_credentials() {
    let source = json!({"source": {"oci": "r.example/p:1"}});
    let in_namespace = |namespace: &str| -> GatewayPlugin {
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
            "metadata": {"name": "p", "namespace": namespace}, "spec": source
        }))
        .unwrap()
    };
    let credentials =
        |plugin: &GatewayPlugin, tenancy: &Tenancy| match super::plugin(plugin, &secrets(&[]), tenancy).unwrap().source
        {
            PluginSource::Oci { credentials, .. } => credentials,
            other => panic!("{other:?}"),
        };
    // By default: the gateway's own namespace borrows them, no other.
    assert_eq!(credentials(&in_namespace("team"), &tenancy()), None);
    assert_eq!(credentials(&in_namespace("team-b"), &tenancy()), Some(RegistryCredentials::Anonymous));
    // Named namespaces replace the default.
    let lent = Tenancy { registry_credential_namespaces: vec!["team-b".into()], ..Tenancy::default() }.resolved("team");
    assert_eq!(credentials(&in_namespace("team-b"), &lent), None);
    assert_eq!(credentials(&in_namespace("team"), &lent), Some(RegistryCredentials::Anonymous));
    // A plugin's own pull Secret is its own, even where the operator's
    // credentials are not lent.
    let with_secret: GatewayPlugin = serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "pull"}}}
    }))
    .unwrap();
    let store = secrets(&[secret("pull", Some("kubernetes.io/basic-auth"), &[("username", "u"), ("password", "pw")])]);
    let decl = super::plugin(&with_secret, &store, &lent).unwrap();
    assert!(matches!(decl.source, PluginSource::Oci { credentials: Some(RegistryCredentials::Basic { .. }), .. }));
}

#[test]
fn the_secret_values_read_are_redacted_in_any_form_a_message_quotes_them() {
    let plugin = gateway_plugin(json!({
        "source": {"oci": "r.example/p:1"},
        "configFrom": [
            {"path": "/value", "secretKeyRef": {"name": "s", "key": "text"}},
            {"path": "/keys", "secretKeyRef": {"name": "s", "key": "json"}, "format": "Json"},
            {"path": "/missing", "secretKeyRef": {"name": "s", "key": "absent"}}
        ]
    }));
    let store = secrets(&[secret("s", None, &[("text", "tab\tsecret\u{1}"), ("json", r#"{"k": ["sk-json-1"]}"#)])]);
    // The lookup fails at the third entry; the values read before it still count.
    let (result, redactions) = super::plugin_redacted(&plugin, &store, &tenancy());
    assert_eq!(result.unwrap_err().reason, reason::SECRET_KEY_NOT_FOUND);
    // As it is, as Rust's `{:?}` quotes it, and as JSON does.
    let text = "tab\tsecret\u{1}";
    let message = format!("value {text} or {text:?} or {}, key sk-json-1", serde_json::to_string(text).unwrap());
    assert_eq!(redactions.apply(&message), r#"value [redacted] or "[redacted]" or "[redacted]", key [redacted]"#);
    assert!(!format!("{redactions:?}").contains("secret"));

    let route = route_with_backend(json!({"url": "http://u.example/v1", "apiKeySecretRef": {"name": "k", "key": "v"}}));
    let store = secrets(&[secret("k", None, &[("v", " sk-route \n")])]);
    let (result, redactions) = super::route_redacted(&route, &store, &tenancy(), |_| true);
    assert!(result.is_ok());
    assert_eq!(redactions.apply("Bearer sk-route rejected; a key"), "Bearer [redacted] rejected; a key");
}

#[test]
fn missing_secrets_and_keys_are_unresolved_refs_without_values() {
    let plugin = gateway_plugin(json!({
        "source": {"oci": "r.example/p:1"},
        "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "missing"}}]
    }));
    let problem = super::plugin(&plugin, &secrets(&[]), &tenancy()).unwrap_err();
    assert_eq!((problem.condition, problem.reason), (Condition::ResolvedRefs, "SecretNotFound"));
    let problem = super::plugin(&plugin, &secrets(&[secret("s", None, &[("other", "v")])]), &tenancy()).unwrap_err();
    assert_eq!(problem.reason, "SecretKeyNotFound");
    let bad_json = gateway_plugin(json!({
        "source": {"oci": "r.example/p:1"},
        "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "v"}, "format": "Json"}]
    }));
    let problem =
        super::plugin(&bad_json, &secrets(&[secret("s", None, &[("v", "sup3r-secret")])]), &tenancy()).unwrap_err();
    assert_eq!(problem.reason, "InvalidSecretValue");
    assert!(!problem.message.contains("sup3r"), "{}", problem.message);
}

#[test]
fn pull_secrets_of_other_types_are_refused() {
    let plugin = gateway_plugin(json!({"source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "o"}}}));
    let problem = super::plugin(&plugin, &secrets(&[secret("o", Some("Opaque"), &[])]), &tenancy()).unwrap_err();
    assert_eq!(problem.reason, "UnsupportedSecretType");
}

#[test]
fn plugin_files_are_read_only_under_the_directories_the_gateway_allows() {
    let file = |path: &str| gateway_plugin(json!({"source": {"file": path}}));
    let refused = |path: &str, tenancy: &Tenancy| super::plugin(&file(path), &secrets(&[]), tenancy).unwrap_err();
    let problem = refused("/plugins/p.wasm", &tenancy());
    assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::NOT_PERMITTED));
    assert_eq!(refused("/dev/zero", &tenancy()).reason, reason::NOT_PERMITTED);

    let allowed = Tenancy { host_file_dirs: vec!["/plugins".into()], ..tenancy() };
    let decl = super::plugin(&file("/plugins/p.wasm"), &secrets(&[]), &allowed).unwrap();
    assert_eq!(decl.source, PluginSource::File("/plugins/p.wasm".into()));
    assert_eq!(refused("/plugins-2/p.wasm", &allowed).reason, reason::NOT_PERMITTED);
    assert_eq!(refused("/dev/zero", &allowed).reason, reason::NOT_PERMITTED);
    assert_eq!(refused("/plugins/../etc/passwd", &allowed).reason, reason::NOT_PERMITTED);
    assert_eq!(refused("plugins/p.wasm", &allowed).reason, reason::INVALID);
}

#[test]
fn an_egress_ca_comes_from_a_secret_or_an_allowed_host_file() {
    let oci = json!({"oci": "r.example/p:1"});
    let with = |destination: Value| gateway_plugin(json!({"source": oci, "egress": {"destinations": [destination]}}));
    let ca = secret("checker-ca", None, &[("ca.crt", "-----BEGIN CERTIFICATE-----")]);
    let by_secret = with(json!({"url": "https://checker.team:8443", "caSecretRef": {"name": "checker-ca"}}));
    let decl = super::plugin(&by_secret, &secrets(std::slice::from_ref(&ca)), &tenancy()).unwrap();
    let grant = decl.egress.unwrap();
    assert_eq!(grant.destinations[0].origin(), "https://checker.team:8443");
    assert!(matches!(&grant.destinations[0].ca, Some(Pem::Value(pem)) if pem.expose().starts_with("-----BEGIN")));
    assert!(plugin_secret_names(&by_secret).contains(&"checker-ca".to_string()), "watched for changes");

    let missing = super::plugin(&by_secret, &secrets(&[]), &tenancy()).unwrap_err();
    assert_eq!(missing.reason, reason::SECRET_NOT_FOUND);
    let no_ca = super::plugin(&by_secret, &secrets(&[secret("checker-ca", None, &[])]), &tenancy()).unwrap_err();
    assert!(no_ca.message.contains("holds no ca.crt"), "{}", no_ca.message);

    let by_file = with(json!({"url": "https://checker.team", "caFile": "/etc/ssl/private/ca.pem"}));
    let refused = super::plugin(&by_file, &secrets(&[]), &tenancy()).unwrap_err();
    assert_eq!(refused.reason, reason::NOT_PERMITTED);
    let allowed = Tenancy { host_file_dirs: vec!["/etc/ssl/private".into()], ..tenancy() };
    assert!(super::plugin(&by_file, &secrets(&[]), &allowed).is_ok());

    let plain = with(json!({"url": "http://checker.team/path"}));
    assert_eq!(super::plugin(&plain, &secrets(&[]), &tenancy()).unwrap_err().reason, reason::INVALID);
}

#[test]
fn verify_keys_come_inline_from_secrets_or_allowed_host_files_in_order() {
    let signed = |keys: Value| gateway_plugin(json!({"source": {"oci": "r.example/p:1"}, "verify": {"keys": keys}}));
    let pem = "-----BEGIN PUBLIC KEY-----\nfrom the secret\n-----END PUBLIC KEY-----\n";
    let keys_secret = secret("cosign", None, &[("cosign.pub", pem)]);
    let plugin = signed(json!([
        {"pem": "-----BEGIN PUBLIC KEY-----\ninline\n-----END PUBLIC KEY-----\n"},
        {"secretRef": {"name": "cosign", "key": "cosign.pub"}}
    ]));
    assert!(plugin_secret_names(&plugin).contains(&"cosign".to_string()), "watched for changes");
    let decl = super::plugin(&plugin, &secrets(std::slice::from_ref(&keys_secret)), &tenancy()).unwrap();
    let PluginSource::Oci { verify: Some(keys), .. } = &decl.source else { panic!("{:?}", decl.source) };
    let texts: Vec<String> = keys.read().unwrap().into_iter().map(|k| String::from_utf8(k).unwrap()).collect();
    assert!(texts[0].contains("inline"), "{texts:?}");
    assert_eq!(texts[1], pem, "the Secret's key fills its own place");

    // A key that cannot be read fails the plugin: it is never dropped,
    // which would leave the other keys (or none) to decide.
    let missing = super::plugin(&plugin, &secrets(&[]), &tenancy()).unwrap_err();
    assert_eq!((missing.condition, missing.reason), (Condition::ResolvedRefs, reason::SECRET_NOT_FOUND));
    let no_key = super::plugin(&plugin, &secrets(&[secret("cosign", None, &[("other", pem)])]), &tenancy());
    assert_eq!(no_key.unwrap_err().reason, reason::SECRET_KEY_NOT_FOUND);

    // A key file only where the operator allows host files.
    let by_file = signed(json!([{"file": "/keys/cosign.pub"}]));
    assert_eq!(super::plugin(&by_file, &secrets(&[]), &tenancy()).unwrap_err().reason, reason::NOT_PERMITTED);
    let relative = signed(json!([{"file": "cosign.pub"}]));
    let allowed = Tenancy { host_file_dirs: vec!["/keys".into()], ..tenancy() };
    assert_eq!(super::plugin(&relative, &secrets(&[]), &allowed).unwrap_err().reason, reason::INVALID);
    let decl = super::plugin(&by_file, &secrets(&[]), &allowed).unwrap();
    let PluginSource::Oci { verify: Some(keys), .. } = &decl.source else { panic!("{:?}", decl.source) };
    assert_eq!(keys.keys, [Pem::File("/keys/cosign.pub".into())]);

    // Two ways to give one key, or verify on a file source, are refused.
    let both = signed(json!([{"pem": "x", "secretRef": {"name": "cosign", "key": "cosign.pub"}}]));
    assert_eq!(super::plugin(&both, &secrets(&[]), &tenancy()).unwrap_err().reason, reason::INVALID);
    let on_file = gateway_plugin(json!({"source": {"file": "/plugins/p.wasm"}, "verify": {"keys": [{"pem": "x"}]}}));
    let allowed = Tenancy { host_file_dirs: vec!["/plugins".into()], ..tenancy() };
    assert_eq!(super::plugin(&on_file, &secrets(&[]), &allowed).unwrap_err().reason, reason::INVALID);
}

fn plugin_secret_names(plugin: &GatewayPlugin) -> Vec<String> {
    plugin.secret_names().map(String::from).collect()
}

fn route_with_backend(backend: Value) -> AIModelRoute {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "AIModelRoute",
        "metadata": {"name": "r", "namespace": "team"},
        "spec": {"models": ["m"], "backends": [backend]}
    }))
    .unwrap()
}

#[test]
fn api_keys_come_from_host_files_or_variables_only_where_the_gateway_allows() {
    let token = route_with_backend(json!({
        "url": "http://attacker.example/v1",
        "apiKeyFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"
    }));
    let home = route_with_backend(json!({"url": "http://attacker.example/v1", "apiKeyEnv": "HOME"}));
    for route in [&token, &home] {
        let problem = super::route(route, &secrets(&[]), &tenancy(), |_| true).unwrap_err();
        assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::NOT_PERMITTED));
    }

    let allowed =
        Tenancy { host_file_dirs: vec!["/keys".into()], host_env_vars: vec!["OPENAI_KEY".into()], ..tenancy() };
    let refused = super::route(&token, &secrets(&[]), &allowed, |_| true).unwrap_err();
    assert_eq!(refused.reason, reason::NOT_PERMITTED);
    assert!(refused.message.contains("/keys"), "{}", refused.message);
    assert_eq!(super::route(&home, &secrets(&[]), &allowed, |_| true).unwrap_err().reason, reason::NOT_PERMITTED);
    let by_file = route_with_backend(json!({"url": "http://u.example/v1", "apiKeyFile": "/keys/openai"}));
    let decl = super::route(&by_file, &secrets(&[]), &allowed, |_| true).unwrap();
    assert_eq!(decl.backends[0].api_key, Some(ApiKeySource::File("/keys/openai".into())));
    let by_env = route_with_backend(json!({"url": "http://u.example/v1", "apiKeyEnv": "OPENAI_KEY"}));
    let decl = super::route(&by_env, &secrets(&[]), &allowed, |_| true).unwrap();
    assert_eq!(decl.backends[0].api_key, Some(ApiKeySource::Env("OPENAI_KEY".into())));
}

#[test]
fn a_route_outside_the_namespaces_granted_a_model_is_refused() {
    let route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
    assert!(super::route(&route, &secrets(&[]), &tenancy(), |_| true).is_ok());
    let elsewhere = Tenancy::default().resolved("sluice-system");
    let problem = super::route(&route, &secrets(&[]), &elsewhere, |_| true).unwrap_err();
    assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::MODEL_NOT_PERMITTED));
    assert!(problem.message.contains("`team`") && problem.message.contains("`m`"), "{}", problem.message);
}

#[test]
fn pointers_create_objects_append_to_arrays_and_refuse_scalars() {
    let mut value = json!({"list": [1], "n": 3});
    set_pointer(&mut value, "/a/b/c", json!(1)).unwrap();
    set_pointer(&mut value, "/list/-", json!(2)).unwrap();
    set_pointer(&mut value, "/list/0", json!(0)).unwrap();
    assert_eq!(value, json!({"a": {"b": {"c": 1}}, "list": [0, 2], "n": 3}));
    assert!(set_pointer(&mut value, "/n/x", json!(1)).is_err());
    assert!(set_pointer(&mut value, "/list/7", json!(1)).is_err());
    assert!(set_pointer(&mut value, "no-slash", json!(1)).is_err());
}

fn ai_route(name: &str, created: &str, models: &[&str]) -> AIModelRoute {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "AIModelRoute",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": created},
        "spec": {"models": models, "backends": [{"url": "http://upstream.example:1/v1"}]}
    }))
    .unwrap()
}

/// A route's backend URL may not name the gateway's own loopback (its
/// admin listener's config view) or the metadata service, unless the
/// operator allows the range; its own listener ports stay refused even
/// then.
#[test]
fn backends_in_the_gateways_own_network_position_are_not_permitted() {
    let with_url = |url: &str| {
        let mut route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
        route.spec.backends[0].url = url.into();
        route
    };
    let tenancy = Tenancy {
        backends: sluice_core::BackendPolicy { restricted: true, own_ports: vec![9901], ..Default::default() },
        ..tenancy()
    };
    for url in ["http://127.0.0.1:9901/admin/config?", "http://169.254.169.254/latest/", "http://localhost:8000/v1"] {
        let problem = super::route(&with_url(url), &secrets(&[]), &tenancy, |_| true).unwrap_err();
        assert_eq!(problem.reason, reason::NOT_PERMITTED, "{url}");
        // The gateway's own listener port is refused as such (no range
        // allows it); the others name the flag that would.
        let why = if url.contains(":9901") { "own listeners" } else { "--allow-backend-cidr" };
        assert!(problem.message.contains(why), "{url}: {}", problem.message);
    }
    let allowed = Tenancy {
        backends: sluice_core::BackendPolicy {
            allowed: vec!["127.0.0.0/8".parse().unwrap()],
            ..tenancy.backends.clone()
        },
        ..tenancy.clone()
    };
    assert!(super::route(&with_url("http://127.0.0.1:8000/v1"), &secrets(&[]), &allowed, |_| true).is_ok());
    let own = super::route(&with_url("http://127.0.0.1:9901/admin/config?"), &secrets(&[]), &allowed, |_| true);
    assert!(own.unwrap_err().message.contains("own listeners"));
    assert!(super::route(&with_url("http://upstream.example/v1"), &secrets(&[]), &tenancy, |_| true).is_ok());
}

#[test]
fn the_older_route_keeps_a_contested_model() {
    let older = ai_route("b-older", "2026-01-01T00:00:00Z", &["m1"]);
    let newer = ai_route("a-newer", "2026-02-01T00:00:00Z", &["m2", "m1"]);
    let decls: Vec<_> =
        [&newer, &older].iter().map(|r| super::route(r, &secrets(&[]), &tenancy(), |_| true).unwrap()).collect();
    let pairs = vec![(&newer, &decls[0]), (&older, &decls[1])];
    let conflicts = model_conflicts(&pairs);
    assert_eq!(conflicts.len(), 1);
    let problem = &conflicts[&ResourceKey::new("team", "a-newer")];
    assert_eq!(problem.reason, reason::MODEL_CONFLICT);
    assert!(problem.message.contains("team/b-older"), "{}", problem.message);
}

#[test]
fn a_route_naming_a_missing_plugin_is_unresolved() {
    let mut route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
    route.spec.plugins = vec![sluice_api::PluginRefSpec { name: "nope".into() }];
    let problem = super::route(&route, &secrets(&[]), &tenancy(), |_| false).unwrap_err();
    assert_eq!(problem.reason, "PluginNotFound");
}

fn mcp(name: &str, created: &str, path: &str, server: Value) -> MCPRoute {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "MCPRoute",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": created},
        "spec": {"path": path, "servers": [server], "plugins": [{"name": "auth"}]}
    }))
    .unwrap()
}

fn mcp_server(extra: Value) -> Value {
    let mut server = json!({"name": "tools", "url": "https://tools.example/mcp"});
    server.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    server
}

/// A server's key and CA come from Secrets in the route's namespace, as a
/// backend's do, and the key is among the values redacted from messages.
#[test]
fn mcp_server_keys_and_tls_come_from_secrets() {
    let route = mcp(
        "m",
        "2026-01-01T00:00:00Z",
        "/mcp",
        mcp_server(json!({"apiKeySecretRef": {"name": "key", "key": "token"}, "tls": {"secretRef": {"name": "ca"}}})),
    );
    let store = secrets(&[secret("key", None, &[("token", "sk-mcp\n")]), secret("ca", None, &[("ca.crt", "PEM")])]);
    let (decl, redactions) = mcp_route_redacted(&route, &store, &tenancy(), |p| p.name == "auth");
    let decl = decl.unwrap();
    let server = &decl.servers[0];
    assert!(matches!(&server.api_key, Some(ApiKeySource::Value(key)) if key.expose() == "sk-mcp"));
    assert!(matches!(&server.tls.as_ref().unwrap().ca, Some(Pem::Value(pem)) if pem.expose() == "PEM"));
    assert_eq!(decl.plugins, [ResourceKey::new("team", "auth")]);
    assert_eq!(redactions.apply("key sk-mcp leaked"), "key [redacted] leaked");

    let problem = mcp_route(&route, &secrets(&[]), &tenancy(), |_| true).unwrap_err();
    assert_eq!((problem.condition, problem.reason), (Condition::ResolvedRefs, reason::SECRET_NOT_FOUND));
    let problem = mcp_route(&route, &store, &tenancy(), |_| false).unwrap_err();
    assert_eq!(
        (problem.reason, problem.message.as_str()),
        (reason::PLUGIN_NOT_FOUND, "GatewayPlugin team/auth does not exist")
    );
}

/// A server is an upstream like a backend: the gateway's own files,
/// variables and network position are not lent to it either.
#[test]
fn mcp_servers_get_no_more_of_the_gateway_than_backends() {
    let refused = [
        mcp_server(json!({"apiKeyFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"})),
        mcp_server(json!({"apiKeyEnv": "HOME"})),
        mcp_server(json!({"url": "http://169.254.169.254/latest/"})),
    ];
    let tenancy =
        Tenancy { backends: sluice_core::BackendPolicy { restricted: true, ..Default::default() }, ..tenancy() };
    for server in refused {
        let route = mcp("m", "2026-01-01T00:00:00Z", "/mcp", server.clone());
        let problem = mcp_route(&route, &secrets(&[]), &tenancy, |_| true).unwrap_err();
        assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::NOT_PERMITTED), "{server}");
    }
    // What the schema lets through and the declaration refuses is Invalid.
    let route = mcp("m", "2026-01-01T00:00:00Z", "/v1/mcp", mcp_server(json!({})));
    let problem = mcp_route(&route, &secrets(&[]), &tenancy, |_| true).unwrap_err();
    assert_eq!(problem.reason, reason::INVALID);
    assert!(problem.message.contains("/v1/mcp"), "{}", problem.message);
}

/// A path is claimed by the namespaces the operator grants it to (by
/// default the gateway's own); elsewhere the route is refused, saying which
/// flag grants paths.
#[test]
fn an_mcp_route_outside_the_namespaces_granted_its_path_is_refused() {
    let route = mcp("m", "2026-01-01T00:00:00Z", "/mcp/team/tools", mcp_server(json!({})));
    assert!(mcp_route(&route, &secrets(&[]), &tenancy(), |_| true).is_ok());
    let elsewhere = Tenancy::default().resolved("sluice-system");
    let problem = mcp_route(&route, &secrets(&[]), &elsewhere, |_| true).unwrap_err();
    assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::PATH_NOT_PERMITTED));
    for part in ["`team`", "`/mcp/team/tools`", "--mcp-path-claim"] {
        assert!(problem.message.contains(part), "{part}: {}", problem.message);
    }
    // A grant below which the path is: allowed; one that only shares its
    // first characters is not.
    let granted = |claim: &str| Tenancy { mcp_path_claims: vec![claim.parse().unwrap()], ..tenancy() };
    assert!(mcp_route(&route, &secrets(&[]), &granted("team=/mcp/team"), |_| true).is_ok());
    let problem = mcp_route(&route, &secrets(&[]), &granted("team=/mcp/te"), |_| true).unwrap_err();
    assert_eq!(problem.reason, reason::PATH_NOT_PERMITTED);
    // Refused before its Secrets are looked up: nothing of the namespace is read for it.
    let keyed = mcp(
        "k",
        "2026-01-01T00:00:00Z",
        "/mcp/team/tools",
        mcp_server(json!({"apiKeySecretRef": {"name": "key", "key": "token"}})),
    );
    let problem = mcp_route(&keyed, &secrets(&[]), &elsewhere, |_| true).unwrap_err();
    assert_eq!(problem.reason, reason::PATH_NOT_PERMITTED);
}

/// Of MCPRoutes claiming one path the oldest serves it, then the first by
/// name; each other one is told which route holds it.
#[test]
fn the_older_mcp_route_keeps_a_contested_path() {
    let older = mcp("b-older", "2026-01-01T00:00:00Z", "/mcp", mcp_server(json!({})));
    let newer = mcp("a-newer", "2026-02-01T00:00:00Z", "/mcp", mcp_server(json!({})));
    let twin = mcp("c-twin", "2026-01-01T00:00:00Z", "/mcp", mcp_server(json!({})));
    let elsewhere = mcp("d-elsewhere", "2026-03-01T00:00:00Z", "/other", mcp_server(json!({})));
    let routes = [&newer, &twin, &elsewhere, &older];
    let decls: Vec<_> = routes.iter().map(|r| mcp_route(r, &secrets(&[]), &tenancy(), |_| true).unwrap()).collect();
    let pairs: Vec<_> = routes.iter().copied().zip(&decls).collect();
    let conflicts = path_conflicts(&pairs);
    let mut losers: Vec<&str> = conflicts.keys().map(|k| k.name.as_str()).collect();
    losers.sort_unstable();
    assert_eq!(losers, ["a-newer", "c-twin"]);
    for problem in conflicts.values() {
        assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::PATH_CONFLICT));
        assert!(problem.message.contains("`/mcp`") && problem.message.contains("team/b-older"), "{}", problem.message);
    }
}
