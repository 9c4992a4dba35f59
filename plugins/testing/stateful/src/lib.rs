//! A test plugin that drives `sluice:plugin/state` from request headers, so
//! the tests can play a tenant's plugin against the gateway's store. It
//! uses the raw bindings (world `stateful-plugin`) to test the host's side
//! of the WIT contract directly.
//!
//! Request headers (each optional):
//! - `x-state-reserve: KEY=AMOUNT`: reserves `AMOUNT` under `KEY` against the
//!   config's `limit` in its `window` (`fixed:SECONDS`, `sliding:SECONDS` or
//!   `month`); refused, the plugin answers 429 with `x-state-remaining` and
//!   `x-state-reset`. Granted, the response carries `x-state-remaining`, and
//!   at `response-end` the reservation is committed with `x-state-commit`'s
//!   amount, or released with `x-state-commit: release`, or left (dropped
//!   unsettled) without it; or, with `x-state-settle: R,I,O[;R,I,O…]`,
//!   handed to the gateway at once with those usage weights (`settle-at-end`),
//!   a store error answering 503 as below.
//! - `x-state-set: KEY=VALUE`, `x-state-get: KEY`, `x-state-delete: KEY`,
//!   `x-state-cas: KEY=EXPECTED=VALUE` (`EXPECTED` empty: absent), with
//!   `x-state-ttl-ms` for the sets; the outcome is in `x-state-value`,
//!   `x-state-done` or, for a store error, a 503 whose `x-state-error` says
//!   which (`unavailable: …` or `refused: …`).
//! - every response carries `x-state-consumer`: `request.consumer()`, or `-`.

use std::cell::RefCell;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../wit", world: "stateful-plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::state::{self, Check, Reservation, Reserved, StateError, Window};
use sluice::plugin::types::{
    ChunkAction, DirectResponse, Hooks, Request, RequestAction, Response, ResponseAction, ResponseEdits,
    ResponseSummary,
};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_limit")]
    limit: u64,
    #[serde(default = "default_window")]
    window: String,
}

fn default_limit() -> u64 {
    10
}

fn default_window() -> String {
    "fixed:60".into()
}

thread_local! {
    static CONFIG: RefCell<Option<Config>> = const { RefCell::new(None) };
    /// The request's reservation and how to settle it, from the request
    /// hook to `response-end` (the same instance serves both).
    static PENDING: RefCell<Option<(Reservation, Option<String>)>> = const { RefCell::new(None) };
}

fn window(spec: &str) -> Result<Window, String> {
    match spec.split_once(':') {
        Some(("fixed", s)) => s.parse().map(Window::Fixed).map_err(|e| format!("window: {e}")),
        Some(("sliding", s)) => s.parse().map(Window::Sliding).map_err(|e| format!("window: {e}")),
        None if spec == "month" => Ok(Window::CalendarMonth),
        _ => Err(format!("window: `{spec}` is not fixed:S, sliding:S or month")),
    }
}

/// `R,I,O;R,I,O`: a check's request, input and output weights, each.
fn usage_weights(spec: &str) -> Option<Vec<state::UsageWeights>> {
    spec.split(';')
        .map(|w| {
            let mut n = w.split(',').map(|n| n.trim().parse::<u64>().ok());
            Some(state::UsageWeights { request: n.next()??, input: n.next()??, output: n.next()?? })
        })
        .collect()
}

fn failed(error: StateError) -> RequestAction {
    let why = match error {
        StateError::Unavailable(why) => format!("unavailable: {why}"),
        StateError::Refused(why) => format!("refused: {why}"),
    };
    respond(503, vec![("x-state-error".into(), why)])
}

fn respond(status: u16, headers: Vec<(String, String)>) -> RequestAction {
    RequestAction::Respond(DirectResponse { status, headers, body: Vec::new() })
}

struct Stateful;

impl Guest for Stateful {
    fn configure(config: String) -> Result<Hooks, String> {
        let parsed: Config = serde_json::from_str(&config).map_err(|e| format!("stateful: invalid config: {e}"))?;
        window(&parsed.window)?;
        CONFIG.with_borrow_mut(|c| *c = Some(parsed));
        Ok(Hooks::REQUEST | Hooks::RESPONSE_END)
    }

    fn request_filter(req: &Request) -> RequestAction {
        let consumer = req.consumer().unwrap_or_else(|| "-".into());
        req.set_response_header("x-state-consumer", &consumer);
        let ttl = req.header("x-state-ttl-ms").and_then(|t| t.parse().ok()).unwrap_or(0);
        if let Some(spec) = req.header("x-state-reserve") {
            let Some((key, amount)) = spec.split_once('=') else { return respond(400, vec![]) };
            let (limit, window) = CONFIG
                .with_borrow(|c| c.as_ref().map(|c| (c.limit, window(&c.window))))
                .unwrap_or((0, Ok(Window::CalendarMonth)));
            let (Ok(window), Ok(amount)) = (window, amount.parse()) else { return respond(400, vec![]) };
            let check = Check { key: key.into(), window, limit, amount };
            match state::reserve(&[check]) {
                Err(e) => return failed(e),
                Ok(Reserved::Refused((_, standings))) => {
                    let s = &standings[0];
                    return respond(
                        429,
                        vec![
                            ("x-state-remaining".into(), s.remaining.to_string()),
                            ("x-state-reset".into(), s.reset_unix_ms.to_string()),
                        ],
                    );
                }
                Ok(Reserved::Granted((reservation, standings))) => {
                    req.set_response_header("x-state-remaining", &standings[0].remaining.to_string());
                    if let Some(spec) = req.header("x-state-settle") {
                        let Some(weights) = usage_weights(&spec) else { return respond(400, vec![]) };
                        if let Err(e) = state::settle_at_end(reservation, &weights) {
                            return failed(e);
                        }
                    } else {
                        PENDING.with_borrow_mut(|p| *p = Some((reservation, req.header("x-state-commit"))));
                    }
                }
            }
        }
        if let Some(spec) = req.header("x-state-set") {
            let Some((key, value)) = spec.split_once('=') else { return respond(400, vec![]) };
            if let Err(e) = state::set(key, value.as_bytes(), ttl) {
                return failed(e);
            }
            req.set_response_header("x-state-done", "set");
        }
        if let Some(spec) = req.header("x-state-cas") {
            let mut parts = spec.splitn(3, '=');
            let (Some(key), Some(expected), Some(value)) = (parts.next(), parts.next(), parts.next()) else {
                return respond(400, vec![]);
            };
            let expected = (!expected.is_empty()).then(|| expected.as_bytes().to_vec());
            match state::compare_and_set(key, expected.as_deref(), value.as_bytes(), ttl) {
                Err(e) => return failed(e),
                Ok(done) => req.set_response_header("x-state-done", if done { "swapped" } else { "kept" }),
            }
        }
        if let Some(key) = req.header("x-state-delete") {
            match state::delete(&key) {
                Err(e) => return failed(e),
                Ok(done) => req.set_response_header("x-state-done", if done { "deleted" } else { "absent" }),
            }
        }
        if let Some(key) = req.header("x-state-get") {
            match state::get(&key) {
                Err(e) => return failed(e),
                Ok(value) => {
                    let value = value.map_or_else(|| "-".into(), |v| String::from_utf8_lossy(&v).into_owned());
                    req.set_response_header("x-state-value", &value);
                }
            }
        }
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

    fn response_end(_summary: ResponseSummary) {
        let Some((reservation, settle)) = PENDING.with_borrow_mut(Option::take) else { return };
        // Errors here have no one to go to: the response is gone.
        match settle.as_deref() {
            Some("release") => drop(reservation.release()),
            Some(amount) => drop(reservation.commit(&[amount.parse().unwrap_or(0)])),
            // Dropped unsettled: it stays counted.
            None => drop(reservation),
        }
    }
}

export!(Stateful);
