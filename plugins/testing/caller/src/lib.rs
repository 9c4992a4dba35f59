//! A test plugin that calls out, routes and counts as request headers say,
//! so the gateway's tests drive the 0.3.2 additions through the SDK:
//! - `x-call: URL` sends a request (`x-call-method`, `x-call-body`,
//!   `x-call-timeout-ms`, `x-call-max-bytes`, and `x-call-header: NAME:
//!   VALUE`, which may repeat) and answers 200 `{"status", "body",
//!   "header_x_seen"}` with what came back, or 502 `{"error": "refused" |
//!   "timeout" | "too_large" | "failed", "message"}`. With `x-call-follow: 1`
//!   a 3xx with a `location` is followed once, as an ordinary client would.
//! - `x-route-model: M` and `x-route-backend: B` route the request on.
//! - `configure` declares the counter `calls{result}` (4 values: a fifth
//!   result counts as `other`) and the histogram `call_seconds`, which each
//!   call adds to. `declareTwice: true` declares again, and so fails.
//!
//! Anything else goes on unchanged.

use serde::Deserialize;
use serde_json::json;
use sluice_plugin_sdk::metrics::{self, Metric};
use sluice_plugin_sdk::outbound::{self, Error};
use sluice_plugin_sdk::prelude::*;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default)]
    declare_twice: bool,
}

struct Caller;

impl Plugin for Caller {
    const NAME: &'static str = "caller";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        let declared = [
            Metric::counter("calls", "Outbound calls by result").labels(&["result"]).max_values(4),
            Metric::histogram("call_seconds", "How long outbound calls took"),
        ];
        metrics::declare(&declared)?;
        if config.declare_twice {
            metrics::declare(&declared)?;
        }
        Ok(Caller)
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        let headers = req.headers();
        if let Some(model) = headers.get_header("x-route-model") {
            req.set_model(model);
        }
        if let Some(backend) = headers.get_header("x-route-backend") {
            req.set_backend(backend);
        }
        let Some(url) = headers.get_header("x-call") else {
            return Ok(Action::Continue);
        };
        let request = request(url, &headers)?;
        let started = host::monotonic_ns();
        let mut result = outbound::send(&request);
        if headers.get_header("x-call-follow") == Some("1")
            && let Ok(response) = &result
            && let Some(next) = redirect(&request, response)
        {
            result = outbound::send(&next);
        }
        metrics::observe("call_seconds", &[], host::monotonic_ns().saturating_sub(started) as f64 / 1e9);
        metrics::add("calls", &[result.as_ref().map_or_else(kind, |_| "ok")], 1);
        let (status, body) = match result {
            Ok(r) => (
                200,
                json!({"status": r.status, "body": String::from_utf8_lossy(&r.body), "header_x_seen": r.header("x-seen")}),
            ),
            Err(e) => (502, json!({"error": kind(&e), "message": e.to_string()})),
        };
        Ok(Action::respond(status, &[("content-type", "application/json")], body.to_string()))
    }
}

fn kind(error: &Error) -> &'static str {
    match error {
        Error::Refused(_) => "refused",
        Error::Timeout => "timeout",
        Error::TooLarge => "too_large",
        Error::Failed(_) => "failed",
    }
}

fn request(url: &str, headers: &[(String, String)]) -> Result<outbound::Request, ApiError> {
    let bad = |what: &str| ApiError::bad_request("bad_header", what);
    let number = |name: &str| headers.get_header(name).map(|n| n.trim().parse::<u32>().map_err(|_| bad(name)));
    let mut request = outbound::Request::new(headers.get_header("x-call-method").unwrap_or("GET"), url);
    request.body = headers.get_header("x-call-body").unwrap_or_default().as_bytes().to_vec();
    request.timeout_ms = number("x-call-timeout-ms").transpose()?;
    if let Some(max) = number("x-call-max-bytes").transpose()? {
        request.max_response_bytes = max as usize;
    }
    for header in headers.get_all_headers("x-call-header") {
        let (name, value) = header.split_once(':').ok_or_else(|| bad("x-call-header"))?;
        request = request.header(name.trim(), value.trim());
    }
    Ok(request)
}

/// What an ordinary client sends for a 3xx with a `location`: 307 and 308
/// repeat the request; the others are a `GET` without a body. Credentials
/// stay with their origin.
fn redirect(request: &outbound::Request, response: &outbound::Response) -> Option<outbound::Request> {
    let location = response.header("location").filter(|_| (300..400).contains(&response.status))?;
    let mut next = request.clone();
    next.url = resolve(&request.url, location);
    if !matches!(response.status, 307 | 308) {
        next.method = "GET".into();
        next.body.clear();
        next.headers.retain(|(name, _)| name != "content-type");
    }
    if origin(&next.url) != origin(&request.url) {
        next.headers.retain(|(name, _)| name != "authorization");
    }
    Some(next)
}

/// `scheme://authority`.
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    &url[..url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i)]
}

/// `location` read against `base` (RFC 3986, without dot segments).
fn resolve(base: &str, location: &str) -> String {
    let origin = origin(base);
    if location.find("://").is_some_and(|i| !location[..i].contains(['/', '?', '#'])) {
        location.to_string()
    } else if location.starts_with("//") {
        format!("{}:{location}", origin.split("://").next().unwrap_or("http"))
    } else if location.starts_with('/') {
        format!("{origin}{location}")
    } else {
        let path = base[origin.len()..].split(['?', '#']).next().unwrap_or_default();
        format!("{origin}{}{location}", path.rfind('/').map_or("/", |i| &path[..=i]))
    }
}

export_plugin!(Caller);

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use sluice_plugin_sdk::testing::{self, counter, observations, on_outbound, outbound_requests};

    use super::*;

    /// Once per test (thread): the gateway takes one declaration.
    fn caller() -> Caller {
        sluice_plugin_sdk::configure::<Caller>("{}").unwrap()
    }

    fn call(plugin: &Caller, headers: &[(&str, &str)]) -> (u16, Value) {
        let req = testing::request_with_headers("m", headers);
        let Ok(Action::Respond(r)) = plugin.on_request(&req, &mut ()) else { panic!("an answer") };
        (r.status, serde_json::from_slice(&r.body).unwrap())
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Result<outbound::Response, Error> {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Ok(outbound::Response { status, headers, body: body.into() })
    }

    #[test]
    fn a_call_answers_what_came_back_and_is_counted() {
        on_outbound(|r| {
            answer(201, &[("x-seen", "yes")], &format!("{} {}", r.method, String::from_utf8_lossy(&r.body)))
        });
        let (status, body) = call(
            &caller(),
            &[
                ("x-call", "https://svc.example/check?x=1"),
                ("x-call-method", "POST"),
                ("x-call-body", "{}"),
                ("x-call-header", "Authorization: Bearer t"),
                ("x-call-timeout-ms", "500"),
                ("x-call-max-bytes", "10"),
            ],
        );
        assert_eq!((status, body), (200, json!({"status": 201, "body": "POST {}", "header_x_seen": "yes"})));
        let expected = outbound::Request::new("POST", "https://svc.example/check?x=1")
            .header("authorization", "Bearer t")
            .timeout_ms(500)
            .max_response_bytes(10);
        assert_eq!(outbound_requests(), [outbound::Request { body: b"{}".to_vec(), ..expected }]);
        assert_eq!((counter("calls", &["ok"]), observations("call_seconds", &[]).len()), (1, 1));
    }

    #[test]
    fn a_failed_call_answers_502_with_its_kind() {
        let plugin = caller();
        let (status, body) = call(&plugin, &[("x-call", "http://svc/")]);
        let refused = json!({"error": "refused", "message": "refused: no outbound responder in this test"});
        assert_eq!((status, body), (502, refused));
        on_outbound(|r| if r.url.ends_with("/slow") { Err(Error::Timeout) } else { answer(200, &[], "12345") });
        assert_eq!(call(&plugin, &[("x-call", "http://svc/slow")]).1["error"], "timeout");
        assert_eq!(call(&plugin, &[("x-call", "http://svc/"), ("x-call-max-bytes", "4")]).1["error"], "too_large");
        assert_eq!(call(&plugin, &[("x-call", "http://svc/")]).1["header_x_seen"], Value::Null);
        on_outbound(|_| Err(Error::Failed("ConnectionRefused".into())));
        assert_eq!(call(&plugin, &[("x-call", "http://svc/")]).1["message"], "failed: ConnectionRefused");
        // Five results, four values: the fifth counts as `other`.
        let counts = ["ok", "refused", "timeout", "too_large", "failed", "other"].map(|r| counter("calls", &[r]));
        assert_eq!(counts, [1, 1, 1, 1, 0, 1]);
    }

    #[test]
    fn a_redirect_is_followed_once_when_asked() {
        on_outbound(|r| match r.url.as_str() {
            "http://a/x/old" => answer(302, &[("location", "new")], ""),
            "http://a/x/new" => answer(307, &[("location", "https://b/next")], ""),
            _ => answer(200, &[], &r.method),
        });
        let headers = [("x-call", "http://a/x/old"), ("x-call-method", "POST"), ("x-call-header", "authorization: k")];
        let plugin = caller();
        assert_eq!(call(&plugin, &headers).1["status"], 302, "not followed unless asked");
        let (_, body) = call(&plugin, &[headers[0], headers[1], headers[2], ("x-call-follow", "1")]);
        assert_eq!(body["status"], 307, "followed once");
        let sent = outbound_requests();
        assert_eq!((sent.len(), sent[2].url.as_str(), sent[2].method.as_str()), (3, "http://a/x/new", "GET"));
        assert_eq!(sent[2].headers, [("authorization".to_string(), "k".to_string())], "the same origin");
        let next = redirect(&sent[2], &answer(307, &[("location", "https://b/next")], "").unwrap()).unwrap();
        assert_eq!((next.url.as_str(), next.method.as_str(), next.headers.len()), ("https://b/next", "GET", 0));
        assert_eq!(resolve("http://a?q", "b"), "http://a/b");
        assert_eq!(resolve("https://a/p", "//c/d"), "https://c/d");
    }

    #[test]
    fn routing_headers_route_and_go_on() {
        let plugin = caller();
        let req = testing::request_with_headers("m", &[("x-route-model", "gpt-4o-mini"), ("x-route-backend", "east")]);
        assert_eq!(plugin.on_request(&req, &mut ()), Ok(Action::Continue));
        assert_eq!(
            (req.routed_model().as_deref(), req.routed_backend().as_deref()),
            (Some("gpt-4o-mini"), Some("east"))
        );
        let req = testing::request_with_headers("m", &[]);
        assert_eq!(plugin.on_request(&req, &mut ()), Ok(Action::Continue));
        assert_eq!((req.routed_model(), outbound_requests().len()), (None, 0));
    }

    #[test]
    fn declaring_twice_fails_configure() {
        let error = sluice_plugin_sdk::configure::<Caller>(r#"{"declareTwice": true}"#).err();
        assert_eq!(error.as_deref(), Some("caller: metrics are declared once, from configure"));
    }
}
