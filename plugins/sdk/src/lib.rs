//! The Rust guest SDK for Sluice plugins.
//!
//! A plugin is a type implementing [`Plugin`]: a typed `Config` the SDK
//! parses from the GatewayPlugin's `spec.config`, the hooks it wants, and only
//! the hook methods it uses. [`export_plugin!`] turns it into the component's
//! exports (not a doctest: `export_plugin!` links only in a wasm build; the
//! plugins in this workspace, e.g. `add-header`, are the compiled examples):
//!
//! ```text
//! use sluice_plugin_sdk::prelude::*;
//!
//! #[derive(serde::Deserialize)]
//! struct Config { header: String }
//!
//! struct Tag(Config);
//!
//! impl Plugin for Tag {
//!     const NAME: &'static str = "tag";
//!     type Config = Config;
//!     type State = ();
//!
//!     fn new(config: Config) -> Result<Self, String> { Ok(Tag(config)) }
//!
//!     fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
//!         req.set_header(&self.0.header, "1");
//!         Ok(Action::Continue)
//!     }
//! }
//!
//! export_plugin!(Tag);
//! ```
//!
//! The hook gets the request as a [`Request`]: a handle to the host's copy,
//! read and edited through calls (`messages`, `splice_messages`, `field`,
//! `set_header`, ...), so a plugin reads only what it needs and the host
//! parses a chat body once for the whole chain.
//!
//! The same code builds natively, so a plugin's logic is unit-tested with
//! plain `cargo test`: [`testing`] builds requests backed by the gateway's
//! own chat body code, and [`host`] has deterministic stand-ins for the
//! calls the gateway provides.

mod action;
pub mod chat;
pub mod host;
mod http;
pub mod metrics;
#[cfg(not(target_arch = "wasm32"))]
mod native;
pub mod outbound;
mod pattern;
mod request;
pub mod state;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde_json::error::Category;

pub use action::{Action, ApiError, HeaderEdits};
pub use http::{HeaderList, header_value};
pub use pattern::ModelPattern;
pub use request::Request;

/// The bindings for `wit/plugin.wit`, generated once for every plugin.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        // The largest world: a plugin imports only what it calls.
        world: "stateful-outbound-plugin",
        // The wasi packages `wasi:http/outgoing-handler` uses, generated here.
        generate_all,
        pub_export_macro: true,
        default_bindings_module: "::sluice_plugin_sdk::bindings",
        additional_derives: [PartialEq],
        // They hold a resource, which has no equality.
        additional_derives_ignore: ["reserved", "stream-error"],
    });
}

pub use bindings::sluice::plugin::types::{
    ChunkAction, DirectResponse, Hooks, LogLevel, RequestKind, Response, ResponseSummary, Usage,
};
pub use serde_json;

use bindings::exports::sluice::plugin::filter::Guest;
use bindings::sluice::plugin::types::{Request as HostRequest, RequestAction, ResponseAction};

/// What most plugins import.
pub mod prelude {
    pub use crate::chat::{Content, ContentPart, Message};
    pub use crate::host;
    pub use crate::{
        Action, ApiError, ChunkAction, HeaderEdits, HeaderList, Hooks, LogLevel, Plugin, Request, RequestKind,
        Response, ResponseSummary, export_plugin,
    };
}

/// A policy plugin. Every hook has a default that changes nothing, so a
/// plugin writes only what it uses, and declares those hooks in `hooks`.
///
/// The gateway calls `configure` (here: `Config` parsing, then `new`) first
/// on every instance. With the default `isolation: PerRequest` every request
/// gets a fresh instance; with `Reused`, one instance serves requests one
/// after another, so request-scoped data belongs in `State`, which the SDK
/// resets for each request, never in the plugin value.
pub trait Plugin: Sized + 'static {
    /// Prefixes configuration errors, so the operator sees which plugin
    /// rejected its config.
    const NAME: &'static str;

    /// `spec.config`, deserialized from JSON. An absent config arrives as `{}`.
    type Config: DeserializeOwned;

    /// Data kept from the request hook to the response hooks of the same
    /// request. Reset to `Default` when a new request starts.
    type State: Default + 'static;

    /// Validates the config and prepares what the hooks need (compiled
    /// patterns, parsed keys). An error rejects the config. Its message
    /// goes to logs, status and Events, so it names fields, never their
    /// values: a value may come from a Secret (`configFrom`).
    fn new(config: Self::Config) -> Result<Self, String>;

    /// The hooks the gateway should call. It skips the others.
    fn hooks(&self) -> Hooks {
        Hooks::REQUEST
    }

    /// Before the request is forwarded: read and edit it through `req`.
    /// `Err` answers the client with an OpenAI-shaped error. Response
    /// headers set here (`req.set_response_header`) need no response hook.
    fn on_request(&self, _req: &Request, _state: &mut Self::State) -> Result<Action, ApiError> {
        Ok(Action::Continue)
    }

    /// On the upstream's response head (`Hooks::RESPONSE_HEAD`).
    fn on_response(&self, _resp: &Response, _state: &mut Self::State) -> HeaderEdits {
        HeaderEdits::new()
    }

    /// On each `data:` payload of an event stream (`Hooks::RESPONSE_CHUNK`).
    fn on_chunk(&self, _data: &str, _state: &mut Self::State) -> ChunkAction {
        ChunkAction::Pass
    }

    /// On the whole body of a response that is not an event stream
    /// (`Hooks::RESPONSE_BODY`). `Some` replaces it.
    fn on_body(&self, _body: &[u8], _state: &mut Self::State) -> Option<Vec<u8>> {
        None
    }

    /// Once the response has ended (`Hooks::RESPONSE_END`).
    fn on_end(&self, _summary: &ResponseSummary, _state: &mut Self::State) {}
}

/// Parses a config the way the gateway's `configure` call does: JSON into
/// `P::Config` (`null` or nothing counts as `{}`), then `P::new`. Errors
/// are prefixed with the plugin's name. Public so tests see the same errors
/// operators do.
pub fn configure<P: Plugin>(config_json: &str) -> Result<P, String> {
    let json = match config_json.trim() {
        "" | "null" => "{}",
        json => json,
    };
    let mut parser = serde_json::Deserializer::from_str(json);
    let invalid = |e: String| format!("{}: invalid config: {e}", P::NAME);
    let config: P::Config =
        serde_path_to_error::deserialize(&mut parser).map_err(|e| invalid(config_error(&e, json)))?;
    // Trailing characters: a syntax error, whose message quotes nothing.
    parser.end().map_err(|e| invalid(e.to_string()))?;
    P::new(config).map_err(|e| format!("{}: {e}", P::NAME))
}

/// Why a config does not parse, without quoting any of its values: serde's
/// own message (`invalid type: string "hunter2", expected a map`) would echo
/// a value a `configFrom` Secret put there into logs, status and Events.
/// Says what kind of error, where (the field path and position), and what
/// was expected.
fn config_error(error: &serde_path_to_error::Error<serde_json::Error>, json: &str) -> String {
    let inner = error.inner();
    let message = inner.to_string();
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    let message = message.strip_suffix(&position).unwrap_or(&message);
    let (what, expected) = match inner.classify() {
        // serde_json's syntax messages are fixed texts ("expected `,` or `}`").
        Category::Syntax | Category::Eof | Category::Io => (message, None),
        Category::Data => data_error(message, json),
    };
    let mut out = what.to_string();
    let path = error.path().to_string();
    if path != "." {
        out.push_str(&format!(" at `{path}`"));
    }
    if inner.line() > 0 {
        out.push_str(&format!(" (line {}, column {})", inner.line(), inner.column()));
    }
    if let Some(expected) = expected {
        out.push_str(": ");
        out.push_str(expected);
    }
    out
}

/// Splits a serde data error into what went wrong and what was expected,
/// dropping the value serde quotes. Messages that name only fields are
/// kept; any other (a custom `Deserialize`) is kept only if it quotes no
/// string of the config.
fn data_error<'a>(message: &'a str, json: &str) -> (&'a str, Option<&'a str>) {
    // The value comes before the last ", expected ": the expectation is the type's own text.
    let expected = || message.rfind(", expected ").map(|i| &message[i + 2..]);
    for (prefix, what) in [
        ("invalid type: ", "invalid type"),
        ("invalid value: ", "invalid value"),
        ("unknown variant ", "unknown variant"),
    ] {
        if message.starts_with(prefix) {
            return (what, expected());
        }
    }
    let names_fields = ["unknown field `", "missing field `", "duplicate field `", "invalid length "];
    if names_fields.iter().any(|prefix| message.starts_with(prefix))
        || message.starts_with("data did not match any variant")
    {
        return (message, None);
    }
    let mut pending: Vec<serde_json::Value> = serde_json::from_str(json).into_iter().collect();
    let mut quotes = false;
    while let Some(value) = pending.pop() {
        match value {
            serde_json::Value::String(s) => quotes |= s.len() >= 4 && message.contains(&s),
            serde_json::Value::Array(items) => pending.extend(items),
            serde_json::Value::Object(map) => pending.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
    if quotes { ("invalid value", Some("the details are withheld, as they quote the value")) } else { (message, None) }
}

/// Where a request is in its life, to know when `State` starts afresh.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Phase {
    Configured,
    Request,
    ResponseHead,
    ResponseBody,
    Ended,
}

struct Instance<P: Plugin> {
    plugin: P,
    state: P::State,
    phase: Phase,
}

impl<P: Plugin> Instance<P> {
    /// Moves to `phase`, resetting the state when a new request has begun:
    /// an earlier phase than the last one seen, a once-per-request phase
    /// seen again (only body events repeat), or anything after the end.
    fn enter(&mut self, phase: Phase) -> (&P, &mut P::State) {
        let repeated = phase == self.phase && phase != Phase::ResponseBody;
        if phase < self.phase || repeated || self.phase == Phase::Ended {
            self.state = P::State::default();
        }
        self.phase = phase;
        (&self.plugin, &mut self.state)
    }
}

thread_local! {
    /// The configured plugin of this instance. Wasm guests are single
    /// threaded; natively each test thread has its own.
    static INSTANCE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

fn with_instance<P: Plugin, R>(phase: Phase, hook: impl FnOnce(&P, &mut P::State) -> R) -> Option<R> {
    INSTANCE.with_borrow_mut(|slot| {
        let instance = slot.as_mut()?.downcast_mut::<Instance<P>>()?;
        let (plugin, state) = instance.enter(phase);
        Some(hook(plugin, state))
    })
}

/// Runs the request hook of this instance's plugin on `req`. (Natively only
/// the tests call it.)
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn handle_request<P: Plugin>(req: &Request) -> RequestAction {
    let action = with_instance::<P, _>(Phase::Request, |plugin, state| plugin.on_request(req, state))
        .unwrap_or_else(|| Err(ApiError::not_configured(P::NAME)));
    match action {
        Ok(action) => action.into_wit(),
        Err(error) => {
            host::log(
                LogLevel::Debug,
                "request rejected",
                &[("status", &error.status.to_string()), ("code", &error.code), ("message", &error.message)],
            );
            error.into_action().into_wit()
        }
    }
}

/// Implements the WIT exports for a [`Plugin`]; used by [`export_plugin!`].
#[doc(hidden)]
pub struct Exported<P>(PhantomData<P>);

impl<P: Plugin> Guest for Exported<P> {
    fn configure(config: String) -> Result<Hooks, String> {
        let plugin = configure::<P>(&config)?;
        let hooks = plugin.hooks();
        let instance = Instance { plugin, state: P::State::default(), phase: Phase::Configured };
        INSTANCE.set(Some(Box::new(instance)));
        Ok(hooks)
    }

    #[cfg(target_arch = "wasm32")]
    fn request_filter(req: &HostRequest) -> RequestAction {
        handle_request::<P>(Request::from_host(req))
    }

    /// Natively there is no host to hand a request over; unit tests call
    /// the plugin (or `handle_request`) with a `testing` request instead.
    #[cfg(not(target_arch = "wasm32"))]
    fn request_filter(_req: &HostRequest) -> RequestAction {
        ApiError::internal("the host's request exists only in wasm").into_action().into_wit()
    }

    fn response_filter(resp: Response) -> ResponseAction {
        let edits = with_instance::<P, _>(Phase::ResponseHead, |plugin, state| plugin.on_response(&resp, state));
        ResponseAction::Continue(edits.unwrap_or_default().into_wit())
    }

    fn response_chunk(data: String) -> ChunkAction {
        with_instance::<P, _>(Phase::ResponseBody, |plugin, state| plugin.on_chunk(&data, state))
            .unwrap_or(ChunkAction::Pass)
    }

    fn response_body(body: Vec<u8>) -> Option<Vec<u8>> {
        with_instance::<P, _>(Phase::ResponseBody, |plugin, state| plugin.on_body(&body, state)).flatten()
    }

    fn response_end(summary: ResponseSummary) {
        with_instance::<P, _>(Phase::Ended, |plugin, state| plugin.on_end(&summary, state));
    }
}

/// Exports a [`Plugin`] type as the component's `filter` interface.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        // The generated macro takes an identifier, not a path or generic type.
        type __SluicePluginExports = $crate::Exported<$plugin>;
        $crate::bindings::export!(__SluicePluginExports with_types_in $crate::bindings);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        limit: u32,
    }

    #[derive(Default)]
    struct Seen(Vec<&'static str>);

    struct Recorder;

    impl Plugin for Recorder {
        const NAME: &'static str = "recorder";
        type Config = Config;
        type State = Seen;

        fn new(config: Config) -> Result<Self, String> {
            if config.limit == 0 { Err("limit must be positive".into()) } else { Ok(Recorder) }
        }

        fn hooks(&self) -> Hooks {
            Hooks::REQUEST | Hooks::RESPONSE_HEAD | Hooks::RESPONSE_END
        }

        fn on_request(&self, req: &Request, seen: &mut Seen) -> Result<Action, ApiError> {
            seen.0.push("request");
            if req.header("x-reject").is_some() {
                return Err(ApiError::new(429, "slow_down", "too many"));
            }
            req.set_response_header("x-request-seen", "1");
            Ok(Action::Continue)
        }

        fn on_response(&self, _resp: &Response, seen: &mut Seen) -> HeaderEdits {
            seen.0.push("response");
            HeaderEdits::new().set_header("x-seen", &seen.0.join(","))
        }
    }

    #[test]
    fn config_errors_name_the_plugin() {
        assert!(configure::<Recorder>(r#"{"limit": 1}"#).is_ok());
        let error = configure::<Recorder>(r#"{"limit": 0}"#).err().unwrap();
        assert_eq!(error, "recorder: limit must be positive");
        let error = configure::<Recorder>(r#"{"limit": 1, "extra": 2}"#).err().unwrap();
        assert!(error.starts_with("recorder: invalid config: unknown field `extra`"), "{error}");
        let error = configure::<Recorder>("null").err().unwrap();
        assert!(error.contains("missing field `limit`"), "null counts as {{}}: {error}");
    }

    // Only parsed, for its errors: the fields are never read.
    #[allow(dead_code)]
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Nested {
        api_keys: Vec<Key>,
        #[serde(default)]
        mode: Option<Mode>,
        #[serde(default)]
        small: Option<u8>,
        #[serde(default, deserialize_with = "echoing")]
        custom: Option<String>,
    }

    #[derive(serde::Deserialize)]
    struct Key {
        #[allow(dead_code)]
        sha256: String,
    }

    #[derive(serde::Deserialize)]
    enum Mode {
        Strict,
    }

    /// A custom `Deserialize` whose error quotes the value, as many do.
    fn echoing<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        use serde::Deserialize as _;
        let value = String::deserialize(d)?;
        Err(serde::de::Error::custom(format!("bad value {value}")))
    }

    struct Strict;

    impl Plugin for Strict {
        const NAME: &'static str = "strict";
        type Config = Nested;
        type State = ();

        fn new(_: Nested) -> Result<Self, String> {
            Ok(Strict)
        }
    }

    #[test]
    fn config_errors_give_the_path_and_expectation_but_never_the_value() {
        use serde_json::json;
        let secret = "hunter2-planted";
        let cases = [
            (
                json!({"apiKeys": [{"sha256": 7}, {"sha256": {"x": secret}}]}),
                "invalid type at `apiKeys[0].sha256`",
                "expected a string",
            ),
            (json!({"apiKeys": secret}), "invalid type at `apiKeys` (line 1, column", "expected a sequence"),
            (json!({"apiKeys": [], "mode": secret}), "unknown variant at `mode`", "expected `Strict`"),
            (json!({"apiKeys": [], "small": 300}), "invalid value at `small`", "expected u8"),
            (json!({"apiKeys": [], "custom": secret}), "invalid value at `custom`", "withheld"),
        ];
        for (config, what, expected) in cases {
            let error = configure::<Strict>(&config.to_string()).err().unwrap();
            assert!(error.starts_with(&format!("strict: invalid config: {what}")), "{error}");
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("hunter2") && !error.contains("300"), "{error}");
        }
        // A custom message that quotes no value is kept.
        let error = configure::<Strict>(r#"{"apiKeys": [], "custom": "x"}"#).err().unwrap();
        assert!(error.ends_with("bad value x at `custom` (line 1, column 30)"), "{error}");
        // Field names are not values: they stay, as does a syntax error's text.
        let error = configure::<Strict>(r#"{"apiKeys": [], "other": 1}"#).err().unwrap();
        assert!(error.contains("unknown field `other`"), "{error}");
        let error = configure::<Strict>(r#"{"apiKeys": []} x"#).err().unwrap();
        assert!(error.contains("trailing characters"), "{error}");
    }

    #[test]
    fn the_exports_route_hooks_to_the_plugin_and_reset_state_per_request() {
        type Exports = Exported<Recorder>;
        assert_eq!(
            Exports::configure(r#"{"limit": 3}"#.into()),
            Ok(Hooks::REQUEST | Hooks::RESPONSE_HEAD | Hooks::RESPONSE_END)
        );
        let response = Response { status: 200, headers: Vec::new() };
        // Two requests on one (reused) instance: the second starts afresh.
        for _ in 0..2 {
            let req = testing::chat_request("m", &serde_json::json!({}));
            assert_eq!(handle_request::<Recorder>(&req), RequestAction::Continue);
            assert_eq!(req.response_header("x-request-seen").as_deref(), Some("1"), "the hook ran on this request");
            let ResponseAction::Continue(edits) = Exports::response_filter(response.clone());
            assert_eq!(edits.set_headers, vec![("x-seen".to_string(), "request,response".to_string())]);
        }
        let rejected = testing::request_with_headers("m", &[("x-reject", "1")]);
        let RequestAction::Respond(direct) = handle_request::<Recorder>(&rejected) else {
            panic!("expected a response")
        };
        assert_eq!(direct.status, 429);
        let body: serde_json::Value = serde_json::from_slice(&direct.body).unwrap();
        assert_eq!(body["error"]["code"], "slow_down");
        assert_eq!(body["error"]["type"], "rate_limit_error");
    }

    #[test]
    fn an_unconfigured_instance_answers_500_rather_than_trapping() {
        INSTANCE.set(None);
        let RequestAction::Respond(direct) =
            handle_request::<Recorder>(&testing::chat_request("m", &serde_json::json!({})))
        else {
            panic!("expected a response")
        };
        assert_eq!(direct.status, 500);
    }
}
