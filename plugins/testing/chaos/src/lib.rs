//! Misbehaves on demand, so the gateway's failure handling can be tested.
//! The request header `x-chaos` picks the failure: `trap`, `spin` or `grow`.
//! Any other request passes with `x-chaos-seen: 1` added.

use std::hint::black_box;

use serde::Deserialize;
use sluice_plugin_sdk::prelude::*;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    reject_config: bool,
}

#[derive(Debug)]
struct ChaosPlugin;

impl Plugin for ChaosPlugin {
    const NAME: &'static str = "chaos";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.reject_config {
            return Err("config rejected on purpose".to_string());
        }
        Ok(ChaosPlugin)
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        match Chaos::requested_by(req) {
            Chaos::Trap => trap(),
            Chaos::Spin => spin(),
            Chaos::Grow => grow(),
            Chaos::None => {
                req.set_header("x-chaos-seen", "1");
                Ok(Action::Continue)
            }
        }
    }
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
        match req.header("x-chaos").as_deref() {
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

export_plugin!(ChaosPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    fn check_config(json: &str) -> Result<(), String> {
        sluice_plugin_sdk::configure::<ChaosPlugin>(json).map(|_| ())
    }

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
        let request = |headers: &[(&str, &str)]| sluice_plugin_sdk::testing::request_with_headers("m", headers);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "trap")])), Chaos::Trap);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "spin")])), Chaos::Spin);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "grow")])), Chaos::Grow);
        assert_eq!(Chaos::requested_by(&request(&[("x-chaos", "nap")])), Chaos::None);
        assert_eq!(Chaos::requested_by(&request(&[("x-other", "trap")])), Chaos::None);
        assert_eq!(Chaos::requested_by(&request(&[])), Chaos::None);
    }

    #[test]
    fn other_requests_pass_marked() {
        let req = sluice_plugin_sdk::testing::request_with_headers("m", &[]);
        assert_eq!(ChaosPlugin.on_request(&req, &mut ()), Ok(Action::Continue));
        assert_eq!(req.header("x-chaos-seen").as_deref(), Some("1"));
    }
}
