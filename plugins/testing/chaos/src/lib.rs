//! Misbehaves on demand, so the gateway's failure handling can be tested.
//! The request header `x-chaos` picks the failure: `trap`, `spin` or `grow`.
//! Any other request passes with `x-chaos-seen: 1` added.

use std::hint::black_box;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::types::{Hooks, Request, RequestAction, RequestEdits, Response, ResponseAction, ResponseEdits};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    reject_config: bool,
}

fn check_config(json: &str) -> Result<(), String> {
    // An absent config may arrive as `null`.
    let config: Option<Config> = serde_json::from_str(json).map_err(|e| format!("chaos: invalid config: {e}"))?;
    if config.unwrap_or_default().reject_config {
        return Err("chaos: config rejected on purpose".to_string());
    }
    Ok(())
}

#[derive(Debug, PartialEq)]
enum Chaos {
    Trap,
    Spin,
    Grow,
    None,
}

impl Chaos {
    fn requested_by(req: &Request) -> Chaos {
        let value = req.headers.iter().find(|(name, _)| name == "x-chaos").map(|(_, v)| v.as_str());
        match value {
            Some("trap") => Chaos::Trap,
            Some("spin") => Chaos::Spin,
            Some("grow") => Chaos::Grow,
            _ => Chaos::None,
        }
    }
}

/// Compiles to the wasm `unreachable` instruction: a trap.
fn trap() -> ! {
    std::process::abort()
}

/// Never returns; only the host's deadline stops it.
fn spin() -> ! {
    let mut turns: u64 = 0;
    loop {
        turns = black_box(turns.wrapping_add(1));
    }
}

/// Keeps 1 MiB chunks alive until memory cannot grow; the failed allocation
/// then aborts.
fn grow() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(black_box(vec![1u8; 1 << 20]));
        black_box(&mut hoard);
    }
}

struct ChaosPlugin;

impl Guest for ChaosPlugin {
    fn configure(config_json: String) -> Result<Hooks, String> {
        check_config(&config_json)?;
        Ok(Hooks::REQUEST)
    }

    fn request_filter(req: Request) -> RequestAction {
        match Chaos::requested_by(&req) {
            Chaos::Trap => trap(),
            Chaos::Spin => spin(),
            Chaos::Grow => grow(),
            Chaos::None => RequestAction::Continue(RequestEdits {
                set_headers: vec![("x-chaos-seen".to_string(), "1".to_string())],
                remove_headers: Vec::new(),
                body: None,
            }),
        }
    }

    fn response_filter(_resp: Response) -> ResponseAction {
        // Not declared in `configure`, so the host never calls it.
        ResponseAction::Continue(ResponseEdits { set_headers: Vec::new(), remove_headers: Vec::new() })
    }
}

export!(ChaosPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_can_be_rejected_on_purpose() {
        assert_eq!(check_config(r#"{"rejectConfig": true}"#).unwrap_err(), "chaos: config rejected on purpose");
        for json in ["null", "{}", r#"{"rejectConfig": false}"#] {
            assert_eq!(check_config(json), Ok(()), "{json}");
        }
        assert!(check_config("not json").unwrap_err().starts_with("chaos: invalid config"));
    }

    #[test]
    fn the_x_chaos_header_picks_the_failure() {
        let request = |headers: &[(&str, &str)]| Request {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: Vec::new(),
            model: "m".into(),
            route: "default/chat".into(),
        };
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "trap")])), Chaos::Trap);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "spin")])), Chaos::Spin);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "grow")])), Chaos::Grow);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "nap")])), Chaos::None);
        assert_eq!(Chaos::requested_by(&request(&[("x-other", "trap")])), Chaos::None);
        assert_eq!(Chaos::requested_by(&request(&[])), Chaos::None);
    }
}
