//! A test plugin that makes the host's response-side behaviour observable.
//! It uses the raw bindings rather than the SDK so it tests the host's side
//! of the WIT contract directly.
//!
//! - `x-probe-served` (response header): how many requests this instance has
//!   seen, which tells a reused instance from a fresh one;
//! - request header `x-probe-trap: 1` traps in the request hook;
//! - config `upper: true` upper-cases `choices[].delta.content` in streamed
//!   chunks; `stopAfter: n` ends the stream after n content chunks;
//!   `failChunk: true` traps on the first chunk;
//! - config `body: true` declares `response-body` and appends
//!   `"probe": "seen"` to a JSON body;
//! - `response-end` logs the summary, usage included, as one line;
//! - config `recordHeader: name` keeps every value of that request header
//!   the instance has seen (the last 16), logs each one, and hands them all
//!   back in the `x-probe-recorded` response header: what a `Reused` plugin
//!   could harvest from requests that reach it.
//! - request header `x-probe-mcp` (WIT 0.3.3): the response headers
//!   `x-probe-kind`, `x-probe-mcp-method`, `x-probe-tool` and
//!   `x-probe-arguments` say what the request handle reads (`-` for none);
//!   unless the header is `read`, its value is then given to
//!   `set-tool-arguments`, and `x-probe-arguments-after` says what is read
//!   back.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;
use serde_json::Value;

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::host::log;
use sluice::plugin::types::{
    ChunkAction, Hooks, LogLevel, Request, RequestAction, RequestKind, Response, ResponseAction, ResponseEdits,
    ResponseSummary,
};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default)]
    upper: bool,
    stop_after: Option<u32>,
    #[serde(default)]
    fail_chunk: bool,
    #[serde(default)]
    body: bool,
    record_header: Option<String>,
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);
static SERVED: AtomicU32 = AtomicU32::new(0);
static CONTENT_CHUNKS: AtomicU32 = AtomicU32::new(0);
static RECORDED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Recorded values kept per instance.
const MAX_RECORDED: usize = 16;

fn with_config<T>(f: impl FnOnce(&Config) -> T) -> T {
    let config = CONFIG.lock().unwrap_or_else(PoisonError::into_inner);
    f(config.as_ref().unwrap_or(&Config::default()))
}

struct Probe;

/// The 0.3.3 calls, made through the raw bindings and reported as response
/// headers.
fn probe_mcp(req: &Request, probe: &str) {
    let or_none = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    let kind = match req.kind() {
        RequestKind::Chat => "chat",
        RequestKind::Mcp => "mcp",
    };
    req.set_response_header("x-probe-kind", kind);
    req.set_response_header("x-probe-mcp-method", &or_none(req.mcp_method()));
    req.set_response_header("x-probe-tool", &or_none(req.tool_name()));
    req.set_response_header("x-probe-arguments", &or_none(req.tool_arguments()));
    if probe != "read" {
        req.set_tool_arguments(probe);
        req.set_response_header("x-probe-arguments-after", &or_none(req.tool_arguments()));
    }
}

impl Guest for Probe {
    fn configure(config: String) -> Result<Hooks, String> {
        let parsed: Config = serde_json::from_str(&config).map_err(|e| format!("probe: invalid config: {e}"))?;
        let mut hooks = Hooks::REQUEST | Hooks::RESPONSE_HEAD | Hooks::RESPONSE_END;
        if parsed.upper || parsed.stop_after.is_some() || parsed.fail_chunk {
            hooks |= Hooks::RESPONSE_CHUNK;
        }
        if parsed.body {
            hooks |= Hooks::RESPONSE_BODY;
        }
        *CONFIG.lock().unwrap_or_else(PoisonError::into_inner) = Some(parsed);
        Ok(hooks)
    }

    fn request_filter(req: &Request) -> RequestAction {
        if req.headers().iter().any(|(name, value)| name == "x-probe-trap" && value == "1") {
            panic!("probe: trap requested");
        }
        SERVED.fetch_add(1, Ordering::Relaxed);
        CONTENT_CHUNKS.store(0, Ordering::Relaxed);
        if let Some(probe) = req.header("x-probe-mcp") {
            probe_mcp(req, &probe);
        }
        if let Some(name) = with_config(|c| c.record_header.clone()) {
            let mut recorded = RECORDED.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(value) = req.header(&name) {
                log(LogLevel::Info, "probe: recorded", &[("value".into(), value.clone())]);
                if recorded.len() == MAX_RECORDED {
                    recorded.remove(0);
                }
                recorded.push(value);
            }
            req.set_response_header("x-probe-recorded", &recorded.join(" | "));
        }
        RequestAction::Continue
    }

    fn response_filter(_resp: Response) -> ResponseAction {
        let served = SERVED.load(Ordering::Relaxed).to_string();
        ResponseAction::Continue(ResponseEdits {
            set_headers: vec![("x-probe-served".into(), served)],
            remove_headers: vec![],
        })
    }

    fn response_chunk(data: String) -> ChunkAction {
        let (upper, stop_after, fail) = with_config(|c| (c.upper, c.stop_after, c.fail_chunk));
        if fail {
            panic!("probe: chunk failure requested");
        }
        let Ok(mut chunk) = serde_json::from_str::<Value>(&data) else {
            return ChunkAction::Pass;
        };
        let Some(content) = chunk.pointer_mut("/choices/0/delta/content") else {
            return ChunkAction::Pass;
        };
        let seen = CONTENT_CHUNKS.fetch_add(1, Ordering::Relaxed) + 1;
        if stop_after.is_some_and(|n| seen > n) {
            return ChunkAction::Stop(None);
        }
        if !upper {
            return ChunkAction::Pass;
        }
        let upper_case = content.as_str().unwrap_or_default().to_uppercase();
        *content = Value::String(upper_case);
        ChunkAction::Replace(chunk.to_string())
    }

    fn response_body(body: Vec<u8>) -> Option<Vec<u8>> {
        let mut json: Value = serde_json::from_slice(&body).ok()?;
        json.as_object_mut()?.insert("probe".into(), Value::String("seen".into()));
        serde_json::to_vec(&json).ok()
    }

    fn response_end(summary: ResponseSummary) {
        let usage = summary.usage.map(|u| (u.prompt_tokens, u.completion_tokens, u.total_tokens));
        let (prompt, completion, total) = usage.unwrap_or_default();
        log(
            LogLevel::Info,
            "probe: response ended",
            &[
                ("status".into(), summary.status.to_string()),
                ("streamed".into(), summary.streamed.to_string()),
                ("completed".into(), summary.completed.to_string()),
                (
                    "usage".into(),
                    if usage.is_some() { format!("{prompt}/{completion}/{total}") } else { "none".into() },
                ),
                ("body_bytes".into(), summary.body_bytes.to_string()),
            ],
        );
    }
}

export!(Probe);
