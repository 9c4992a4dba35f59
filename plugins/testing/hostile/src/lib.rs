//! A test plugin that attacks the host from inside the sandbox, so the
//! runtime's limits can be tested. It uses the raw bindings, like `probe`.
//!
//! - config `sleepInConfigureMs: n` sleeps in `configure` (WASI
//!   monotonic-clock subscribe + poll, what `std::thread::sleep` does);
//! - config `responseHooks: true` also declares `response-head`, so an
//!   instance is held until the response is over;
//! - config `growInConfigure: true` grows linear memory in `configure`
//!   until the host refuses, and keeps it (a `Reused` instance holds it
//!   while idle); `allocateInConfigureMiB: n` allocates n MiB there and
//!   keeps it, aborting if it cannot;
//! - config `requestHook: false` declares no request hook (a module an
//!   Auth-phase plugin must not be);
//! - request header `x-hostile` picks an attack in the request hook:
//!   `sleep` sleeps for 30 s; `forge` logs a message and fields with
//!   newlines and escape sequences in them; `flood` logs 10 000 lines;
//!   `count` counts the tokens of the request body for the request's model;
//!   `connect` opens a TCP connection to 127.0.0.1:9 (WASI sockets);
//!   `headers` sets 40 000 distinct request headers and `response-headers`
//!   as many response headers (past what an HTTP header map holds);
//!   `big-header` sets one 8 MiB header value; `grow` splices a 1 MiB
//!   message in 200 times (the host's copy of the body must not grow past
//!   its limit); anything else, or none, passes with `x-hostile-seen: 1`
//!   added.

use std::time::Duration;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::host::{count_tokens, log};
use sluice::plugin::types::{
    ChunkAction, Content, Hooks, LogLevel, Message, Request, RequestAction, Response, ResponseAction, ResponseEdits,
    ResponseSummary,
};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    sleep_in_configure_ms: Option<u64>,
    #[serde(default)]
    response_hooks: bool,
    #[serde(default)]
    grow_in_configure: bool,
    allocate_in_configure_mi_b: Option<usize>,
    /// `false` declares no request hook: a module the gateway must refuse
    /// in the Auth phase.
    #[serde(default = "yes")]
    request_hook: bool,
}

fn yes() -> bool {
    true
}

struct Hostile;

impl Guest for Hostile {
    fn configure(config: String) -> Result<Hooks, String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("hostile: invalid config: {e}"))?;
        if let Some(ms) = config.sleep_in_configure_ms {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if config.grow_in_configure {
            // Raw growth, not allocation: a refused `memory.grow` returns -1
            // rather than aborting, so `configure` succeeds holding it all.
            #[cfg(target_arch = "wasm32")]
            while core::arch::wasm32::memory_grow(0, 16) != usize::MAX {}
        }
        if let Some(mib) = config.allocate_in_configure_mi_b {
            std::mem::forget(vec![1u8; mib << 20]);
        }
        let mut hooks = if config.request_hook { Hooks::REQUEST } else { Hooks::empty() };
        if config.response_hooks {
            hooks |= Hooks::RESPONSE_HEAD;
        }
        Ok(hooks)
    }

    fn request_filter(req: &Request) -> RequestAction {
        let attack = req.header("x-hostile");
        match attack.as_deref() {
            Some("sleep") => std::thread::sleep(Duration::from_secs(30)),
            Some("forge") => log(
                LogLevel::Warn,
                "hostile: one line\n2030-01-01T00:00:00Z ERROR forged: admin logged in\r\x1b[2K",
                &[("user\nFORGED".into(), "x\nFORGED-FIELD".into()), ("ok".into(), "plain".into())],
            ),
            Some("flood") => {
                for i in 0..10_000 {
                    log(LogLevel::Info, &format!("hostile: flood {i}"), &[]);
                }
            }
            Some("connect") => {
                let result = std::net::TcpStream::connect("127.0.0.1:9").map(drop);
                req.set_header("x-hostile-connect", &format!("{result:?}"));
            }
            Some("headers") => {
                for i in 0..40_000 {
                    req.set_header(&format!("x-h-{i}"), "v");
                }
            }
            Some("response-headers") => {
                for i in 0..40_000 {
                    req.set_response_header(&format!("x-h-{i}"), "v");
                }
            }
            Some("big-header") => req.set_header("x-big", &"v".repeat(8 << 20)),
            Some("grow") => {
                let message =
                    Message { role: "user".into(), content: Content::Text("x".repeat(1 << 20)), extra: String::new() };
                for _ in 0..200 {
                    req.splice_messages(0, 0, std::slice::from_ref(&message));
                }
            }
            Some("count") => {
                let body = req.body();
                let text = String::from_utf8_lossy(&body);
                req.set_header("x-hostile-tokens", &count_tokens(&req.model(), &text).to_string());
            }
            _ => {}
        }
        req.set_header("x-hostile-seen", "1");
        RequestAction::Continue
    }

    fn response_filter(_resp: Response) -> ResponseAction {
        ResponseAction::Continue(ResponseEdits { set_headers: vec![], remove_headers: vec![] })
    }

    fn response_chunk(_data: String) -> ChunkAction {
        ChunkAction::Pass
    }

    fn response_body(_body: Vec<u8>) -> Option<Vec<u8>> {
        None
    }

    fn response_end(_summary: ResponseSummary) {}
}

export!(Hostile);
