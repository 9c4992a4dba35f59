//! The end-to-end tests: the real `sluice` binary, real plugins, real
//! upstreams, registries, API servers and collectors, over real HTTP. One
//! binary, a module per theme: the suite links once, and a new test goes in
//! the module of its theme (or a new module here) with no manifest edit.
//! `cargo test --test e2e THEME::` runs one theme.

// The MCP gateway: the official MCP Python SDK as client and servers.
mod mcp;
mod mcp_hostile;
mod mcp_kubernetes;

// The proxy: routing, bodies, streams, limits, reloads and failures.
mod config;
mod failures;
mod limits;
mod providers;
mod proxy;
mod reload;
mod resilience;
mod response_hooks;
// The echo upstream's shapes, parsed by the official Anthropic and OpenAI
// Python SDKs.
mod upstream_shapes;
// Upstreams that lie or hurt; per-backend TLS with a private CA, serverName
// and mutual TLS.
mod backend_tls;
mod hostile_upstream;

// First-party plugins (plugins/*) through the real gateway, and the
// decorator-lite example in every guest language (plugins/examples).
mod conformance;
mod plugin_auth;
mod plugin_auth_remote;
mod plugin_cache;
mod plugin_context_trim;
mod plugin_counter;
mod plugin_egress;
mod plugin_examples;
mod plugin_guardrail;
mod plugin_guardrail_presidio;
mod plugin_model_router;
mod plugin_outbound_languages;
mod plugin_prompts;
mod plugin_quota;
mod plugin_response_guard;
mod plugin_routing;
mod plugin_state_redis;
mod plugin_support;
mod plugin_versions;
// Plugins that attack the host: expensive host calls, blocking WASI calls,
// instance exhaustion, log forging and floods.
mod hostile_plugins;

// Plugins from a real registry (`docker-registry`), and registries that lie
// and artifacts built to hurt.
mod oci;
mod oci_gateway;
mod oci_hostile;

// A real kube-apiserver and etcd (harness/kube.rs): the harness itself,
// Sluice driven with kubectl, leader election, and many resources at once.
mod kube_apiserver;
mod kubernetes;
mod kubernetes_scale;
mod leader;

// Metrics against a real Prometheus, the access log, request ids, traces and
// OTLP metrics against a real OpenTelemetry Collector, and that harness
// without a gateway.
mod telemetry;
mod telemetry_infra;
mod telemetry_otlp;

// Isolation between clients, tenants, plugins and backends: a module per
// part of docs/security.md's threat model.
mod isolation;

// Installing it: the container image run with podman, the Helm chart on the
// real apiserver, cosign-signed plugins both ways, and `sluice plugin new`
// in each language.
mod helm;
mod image;
mod plugin_new;
mod plugin_signing;
