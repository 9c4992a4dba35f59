//! Answers a request directly, by default with 403, when a request header
//! holds a denied value or the request asks for a denied model.

use serde::Deserialize;
use sluice_plugin_sdk::prelude::*;

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

#[derive(Debug)]
struct Deny(Config);

impl Plugin for Deny {
    const NAME: &'static str = "deny";
    type Config = Config;
    type State = ();

    fn new(mut config: Config) -> Result<Self, String> {
        match (&config.header, config.values.is_empty()) {
            (Some(_), true) => return Err("`header` needs at least one of `values`".into()),
            (None, false) => return Err("`values` needs a `header` to match".into()),
            (None, true) if config.models.is_empty() => {
                return Err("nothing to match on: set `header` and `values`, or `models`".into());
            }
            _ => {}
        }
        if let Some(header) = &mut config.header {
            // The host gives request header names in lower case.
            *header = header.to_ascii_lowercase();
        }
        if !(400..=599).contains(&config.status) {
            return Err(format!("status {} is outside 400..=599", config.status));
        }
        Ok(Deny(config))
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        match self.denial_reason(req) {
            Some(reason) => {
                host::log(LogLevel::Info, "request denied", &[("reason", &reason)]);
                Err(self.error())
            }
            None => Ok(Action::Continue),
        }
    }
}

impl Deny {
    /// Why `req` is denied, or `None` to let it through.
    fn denial_reason(&self, req: &Request) -> Option<String> {
        let config = &self.0;
        if let Some(header) = &config.header {
            let headers = req.headers();
            let denied_value = headers.get_all_headers(header).find(|value| config.values.iter().any(|v| v == value));
            if let Some(value) = denied_value {
                return Some(format!("header {header} is {value:?}"));
            }
        }
        if !config.models.is_empty() {
            let model = req.model();
            if config.models.contains(&model) {
                return Some(format!("model {model:?} is denied"));
            }
        }
        None
    }

    fn error(&self) -> ApiError {
        // Always a permission error, whatever status the operator picked.
        ApiError::new(self.0.status, "request_denied", &self.0.message).with_type("permission_error")
    }
}

export_plugin!(Deny);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Deny, String> {
        sluice_plugin_sdk::configure::<Deny>(json)
    }

    fn request(model: &str, headers: &[(&str, &str)]) -> Request {
        sluice_plugin_sdk::testing::raw_request(model, headers, Vec::new())
    }

    const EXAMPLE: &str = r#"{"header": "X-Tenant", "values": ["blocked"],
        "models": ["forbidden-model"], "status": 451, "message": "tenant is not allowed"}"#;

    #[test]
    fn denies_a_listed_header_value() {
        let config = parse(EXAMPLE).unwrap();
        let req = request("gpt-4o-mini", &[("x-other", "blocked"), ("x-tenant", "ok"), ("x-tenant", "blocked")]);
        assert_eq!(config.denial_reason(&req).unwrap(), r#"header x-tenant is "blocked""#);
    }

    #[test]
    fn denies_a_listed_model() {
        let config = parse(EXAMPLE).unwrap();
        let req = request("forbidden-model", &[("x-tenant", "ok")]);
        assert_eq!(config.denial_reason(&req).unwrap(), r#"model "forbidden-model" is denied"#);
    }

    #[test]
    fn lets_other_requests_through() {
        let config = parse(EXAMPLE).unwrap();
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
        let deny = parse(EXAMPLE).unwrap();
        let Err(error) = deny.on_request(&request("forbidden-model", &[]), &mut ()) else { panic!("denied") };
        let Action::Respond(response) = error.into_action() else { panic!("an error responds") };
        assert_eq!(response.status, 451);
        assert_eq!(response.headers, vec![("content-type".to_string(), "application/json".to_string())]);
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "tenant is not allowed",
                "type": "permission_error", "param": null, "code": "request_denied"}})
        );
    }

    #[test]
    fn defaults_to_403() {
        let config = parse(r#"{"models": ["m"]}"#).unwrap();
        assert_eq!(config.0.status, 403);
        assert_eq!(config.0.message, "request denied by policy");
    }

    #[test]
    fn rejects_configs_with_nothing_to_match() {
        for json in [r#"{}"#, r#"{"models": [], "status": 403}"#] {
            let err = parse(json).unwrap_err();
            assert!(err.contains("nothing to match on"), "{json}: {err}");
        }
        let err = parse(r#"{"header": "x-tenant"}"#).unwrap_err();
        assert!(err.contains("needs at least one of `values`"), "{err}");
        let err = parse(r#"{"values": ["blocked"], "models": ["m"]}"#).unwrap_err();
        assert!(err.contains("needs a `header`"), "{err}");
    }

    #[test]
    fn rejects_a_status_outside_4xx_5xx() {
        for status in [200, 399, 600] {
            let json = serde_json::json!({"models": ["m"], "status": status}).to_string();
            let err = parse(&json).unwrap_err();
            assert!(err.contains("outside 400..=599"), "{status}: {err}");
        }
        for status in [400, 599] {
            let json = serde_json::json!({"models": ["m"], "status": status}).to_string();
            assert_eq!(parse(&json).unwrap().0.status, status);
        }
    }
}
