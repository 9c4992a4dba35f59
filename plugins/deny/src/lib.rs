//! Answers a request directly, by default with 403, when a request header
//! holds a denied value or the request asks for a denied model.

use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::host::log;
use sluice::plugin::types::{
    DirectResponse, Hooks, LogLevel, Request, RequestAction, RequestEdits, Response, ResponseAction, ResponseEdits,
};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    /// The request header whose value is checked against `values`.
    header: Option<String>,
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default = "default_status")]
    status: u16,
    #[serde(default = "default_message")]
    message: String,
}

fn default_status() -> u16 {
    403
}

fn default_message() -> String {
    "request denied by policy".to_string()
}

impl Config {
    fn parse(json: &str) -> Result<Self, String> {
        let mut config: Config = serde_json::from_str(json).map_err(|e| format!("deny: invalid config: {e}"))?;
        match (&config.header, config.values.is_empty()) {
            (Some(_), true) => return Err("deny: `header` needs at least one of `values`".into()),
            (None, false) => return Err("deny: `values` needs a `header` to match".into()),
            (None, true) if config.models.is_empty() => {
                return Err("deny: nothing to match on: set `header` and `values`, or `models`".into());
            }
            _ => {}
        }
        if let Some(header) = &mut config.header {
            // The host gives request header names in lower case.
            *header = header.to_ascii_lowercase();
        }
        if !(400..=599).contains(&config.status) {
            return Err(format!("deny: status {} is outside 400..=599", config.status));
        }
        Ok(config)
    }

    /// Why `req` is denied, or `None` to let it through.
    fn denial_reason(&self, req: &Request) -> Option<String> {
        if let Some(header) = &self.header {
            let denied_value =
                req.headers.iter().filter(|(name, _)| name == header).find(|(_, value)| self.values.contains(value));
            if let Some((_, value)) = denied_value {
                return Some(format!("header {header} is {value:?}"));
            }
        }
        if self.models.contains(&req.model) {
            return Some(format!("model {:?} is denied", req.model));
        }
        None
    }

    fn response(&self) -> DirectResponse {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": "permission_error",
                "code": "request_denied",
            }
        });
        DirectResponse {
            status: self.status,
            headers: vec![("content-type".to_string(), "application/json".to_string())],
            body: body.to_string().into_bytes(),
        }
    }
}

/// Set by `configure`, which the host calls first on every instance.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

fn config() -> MutexGuard<'static, Option<Config>> {
    CONFIG.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Deny;

impl Guest for Deny {
    fn configure(config_json: String) -> Result<Hooks, String> {
        *config() = Some(Config::parse(&config_json)?);
        Ok(Hooks::REQUEST)
    }

    fn request_filter(req: Request) -> RequestAction {
        let Some(config) = &*config() else {
            // An empty body asks the host to write its OpenAI-shaped error.
            return RequestAction::Respond(DirectResponse { status: 500, headers: Vec::new(), body: Vec::new() });
        };
        match config.denial_reason(&req) {
            Some(reason) => {
                log(LogLevel::Info, "request denied", &[("reason".to_string(), reason)]);
                RequestAction::Respond(config.response())
            }
            None => RequestAction::Continue(RequestEdits {
                set_headers: Vec::new(),
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

export!(Deny);

#[cfg(test)]
mod tests {
    use super::*;

    fn request(model: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: Vec::new(),
            model: model.into(),
            route: "default/chat".into(),
        }
    }

    const EXAMPLE: &str = r#"{"header": "X-Tenant", "values": ["blocked"],
        "models": ["forbidden-model"], "status": 451, "message": "tenant is not allowed"}"#;

    #[test]
    fn denies_a_listed_header_value() {
        let config = Config::parse(EXAMPLE).unwrap();
        let req = request("gpt-4o-mini", &[("x-other", "blocked"), ("x-tenant", "ok"), ("x-tenant", "blocked")]);
        assert_eq!(config.denial_reason(&req).unwrap(), r#"header x-tenant is "blocked""#);
    }

    #[test]
    fn denies_a_listed_model() {
        let config = Config::parse(EXAMPLE).unwrap();
        let req = request("forbidden-model", &[("x-tenant", "ok")]);
        assert_eq!(config.denial_reason(&req).unwrap(), r#"model "forbidden-model" is denied"#);
    }

    #[test]
    fn lets_other_requests_through() {
        let config = Config::parse(EXAMPLE).unwrap();
        for req in [
            request("gpt-4o-mini", &[]),
            request("gpt-4o-mini", &[("x-tenant", "Blocked")]),
            request("gpt-4o-mini", &[("x-other", "blocked")]),
            request("forbidden-model-2", &[]),
        ] {
            assert_eq!(config.denial_reason(&req), None, "{req:?}");
        }
    }

    #[test]
    fn responds_with_an_openai_shaped_error() {
        let response = Config::parse(EXAMPLE).unwrap().response();
        assert_eq!(response.status, 451);
        assert_eq!(response.headers, vec![("content-type".to_string(), "application/json".to_string())]);
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "tenant is not allowed",
                "type": "permission_error", "code": "request_denied"}})
        );
    }

    #[test]
    fn defaults_to_403() {
        let config = Config::parse(r#"{"models": ["m"]}"#).unwrap();
        assert_eq!(config.status, 403);
        assert_eq!(config.message, "request denied by policy");
    }

    #[test]
    fn rejects_configs_with_nothing_to_match() {
        for json in [r#"{}"#, r#"{"models": [], "status": 403}"#] {
            let err = Config::parse(json).unwrap_err();
            assert!(err.contains("nothing to match on"), "{json}: {err}");
        }
        let err = Config::parse(r#"{"header": "x-tenant"}"#).unwrap_err();
        assert!(err.contains("needs at least one of `values`"), "{err}");
        let err = Config::parse(r#"{"values": ["blocked"], "models": ["m"]}"#).unwrap_err();
        assert!(err.contains("needs a `header`"), "{err}");
    }

    #[test]
    fn rejects_a_status_outside_4xx_5xx() {
        for status in [200, 399, 600] {
            let json = serde_json::json!({"models": ["m"], "status": status}).to_string();
            let err = Config::parse(&json).unwrap_err();
            assert!(err.contains("outside 400..=599"), "{status}: {err}");
        }
        for status in [400, 599] {
            let json = serde_json::json!({"models": ["m"], "status": status}).to_string();
            assert_eq!(Config::parse(&json).unwrap().status, status);
        }
    }
}
