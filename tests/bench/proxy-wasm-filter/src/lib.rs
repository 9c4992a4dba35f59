//! decorator-lite as a proxy-wasm filter: sets a request header and prepends
//! a system message to the chat request's `messages`. The config (Envoy's
//! `configuration`) is `{"header", "value", "system"}`, read once per VM.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde_json::{Value, json};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { config: None }) });
}}

struct Config {
    header: String,
    value: String,
    system: String,
}

struct Root {
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(bytes) = self.get_plugin_configuration() else {
            return false;
        };
        let config: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let field = |name: &str| config[name].as_str().map(str::to_owned);
        match (field("header"), field("value"), field("system")) {
            (Some(header), Some(value), Some(system)) => {
                self.config = Some(Rc::new(Config { header, value, system }));
                true
            }
            // Envoy refuses the filter config.
            _ => false,
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(Decorate { config }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Decorate {
    config: Rc<Config>,
}

impl Context for Decorate {}

impl HttpContext for Decorate {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.set_http_request_header(&self.config.header, Some(&self.config.value));
        // The body grows; Envoy sends it chunked instead.
        self.set_http_request_header("content-length", None);
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Buffer until the whole body is here.
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        let mut chat: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(messages) = chat.get_mut("messages").and_then(Value::as_array_mut) else {
            let error = json!({"error": {"message": "the request body needs a \"messages\" array",
                "type": "invalid_request_error", "param": null, "code": "invalid_messages"}});
            self.send_http_response(
                400,
                vec![("content-type", "application/json")],
                Some(error.to_string().as_bytes()),
            );
            return Action::Pause;
        };
        messages.insert(0, json!({"role": "system", "content": self.config.system}));
        self.set_http_request_body(0, body_size, chat.to_string().as_bytes());
        Action::Continue
    }
}
