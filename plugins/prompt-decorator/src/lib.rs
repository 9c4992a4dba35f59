//! Adds configured messages around every chat request: `prepend` before the
//! client's messages, `append` after them. The host inserts them; every other
//! byte of the body, the client's messages included, is left as it was.

use serde::Deserialize;
use sluice_plugin_sdk::prelude::*;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default)]
    prepend: Vec<Decoration>,
    #[serde(default)]
    append: Vec<Decoration>,
    /// Put `prepend` after the client's leading system messages rather than
    /// before them, so a client's own system prompt stays first.
    #[serde(default)]
    prepend_after_system: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decoration {
    role: String,
    content: String,
}

struct PromptDecorator {
    prepend: Vec<Message>,
    append: Vec<Message>,
    prepend_after_system: bool,
}

impl Plugin for PromptDecorator {
    const NAME: &'static str = "prompt-decorator";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.prepend.is_empty() && config.append.is_empty() {
            return Err("set `prepend`, `append` or both".into());
        }
        let messages = |decorations: Vec<Decoration>, field: &str| {
            decorations
                .into_iter()
                .enumerate()
                .map(|(i, d)| match d.role.as_str() {
                    "system" | "developer" | "user" | "assistant" => Ok(Message::new(&d.role, &d.content)),
                    other => Err(format!("{field}[{i}]: role {other:?} is not system, developer, user or assistant")),
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(PromptDecorator {
            prepend: messages(config.prepend, "prepend")?,
            append: messages(config.append, "append")?,
            prepend_after_system: config.prepend_after_system,
        })
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        // It adds chat messages only: a request to any other endpoint would
        // go out without them, so it is refused.
        if !req.is_chat_completion() {
            return Err(ApiError::unsupported_endpoint(Self::NAME, &req.path_only(), &["/v1/chat/completions"]));
        }
        // Also checks it is a chat request: a 400 if not.
        let count = req.message_count()?;
        let at = if self.prepend_after_system && !self.prepend.is_empty() { leading_system_messages(req)? } else { 0 };
        // Appended first, so `at` still counts the client's messages only.
        if !self.append.is_empty() {
            req.splice_messages(count, 0, &self.append);
        }
        if !self.prepend.is_empty() {
            req.splice_messages(at, 0, &self.prepend);
        }
        Ok(Action::Continue)
    }
}

/// How many messages at the start are system messages. Reading roles means
/// reading the messages: only `prependAfterSystem` pays for it.
fn leading_system_messages(req: &Request) -> Result<u32, ApiError> {
    Ok(req.messages()?.iter().take_while(|m| m.is_system()).count() as u32)
}

export_plugin!(PromptDecorator);

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use sluice_plugin_sdk::testing::{chat_request, raw_request};

    use super::*;

    fn decorator(config: Value) -> Result<PromptDecorator, String> {
        sluice_plugin_sdk::configure::<PromptDecorator>(&config.to_string())
    }

    fn decorated(decorator: &PromptDecorator, body: Value) -> Value {
        let req = chat_request("m", &body);
        assert_eq!(decorator.on_request(&req, &mut ()), Ok(Action::Continue));
        req.body_json()
    }

    const CONFIG: &str = r#"{"prepend": [{"role": "system", "content": "Answer in English."}],
        "append": [{"role": "user", "content": "Cite your sources."}]}"#;

    #[test]
    fn wraps_the_client_messages_and_keeps_other_fields() {
        let decorator = sluice_plugin_sdk::configure::<PromptDecorator>(CONFIG).unwrap();
        let body = json!({"temperature": 0, "messages": [{"role": "system", "content": "be terse"},
            {"role": "user", "content": "hi", "name": "ann"}], "stream": true});
        let out = decorated(&decorator, body);
        assert_eq!(
            out,
            json!({"temperature": 0, "messages": [
                {"role": "system", "content": "Answer in English."},
                {"role": "system", "content": "be terse"},
                {"role": "user", "content": "hi", "name": "ann"},
                {"role": "user", "content": "Cite your sources."}
            ], "stream": true, "model": "m"})
        );
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["temperature", "messages", "stream", "model"], "field order is kept");
    }

    #[test]
    fn prepend_after_system_keeps_the_client_system_prompt_first() {
        let after_system = decorator(json!({"prependAfterSystem": true,
            "prepend": [{"role": "user", "content": "context"}]}))
        .unwrap();
        let out = decorated(
            &after_system,
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}),
        );
        let roles: Vec<&str> =
            out["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(roles, ["s", "context", "q"]);

        // Only the client's leading system messages count, not appended ones.
        let with_append = decorator(json!({"prependAfterSystem": true,
            "prepend": [{"role": "user", "content": "context"}], "append": [{"role": "system", "content": "end"}]}))
        .unwrap();
        let out = decorated(&with_append, json!({"messages": [{"role": "developer", "content": "s"}]}));
        let contents: Vec<&str> =
            out["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(contents, ["s", "context", "end"]);
    }

    #[test]
    fn the_client_messages_keep_their_bytes() {
        let decorator = sluice_plugin_sdk::configure::<PromptDecorator>(CONFIG).unwrap();
        let client = r#"{"role": "user", "content": "hi", "n": 1.0e5}"#;
        let body = format!(r#"{{"model": "m", "messages": [ {client} ], "x": 123456789012345678901234567890}}"#);
        let req = raw_request("m", &[], body.into_bytes());
        decorator.on_request(&req, &mut ()).unwrap();
        let out = req.body_text();
        assert!(out.contains(client), "{out}");
        assert!(out.ends_with(r#""x": 123456789012345678901234567890}"#), "{out}");
        assert_eq!(req.message_count().unwrap(), 3);
    }

    #[test]
    fn config_values_are_data_not_json() {
        let hostile = "\"}],\"model\":\"other\",\"x\":[{\"";
        let decorator = decorator(json!({"append": [{"role": "user", "content": hostile}]})).unwrap();
        let out = decorated(&decorator, json!({"messages": []}));
        assert_eq!(out["model"], "m");
        assert_eq!(out["messages"][0]["content"], hostile);
    }

    #[test]
    fn invalid_requests_and_other_endpoints() {
        let decorator = sluice_plugin_sdk::configure::<PromptDecorator>(CONFIG).unwrap();
        let error = decorator.on_request(&raw_request("m", &[], b"not json".to_vec()), &mut ()).unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (400, "invalid_json"));
        let error = decorator.on_request(&chat_request("m", &json!({"messages": "hi"})), &mut ()).unwrap_err();
        assert_eq!(error.code, "invalid_chat_request");
        // Endpoints it cannot read, the Responses API among them, are
        // refused rather than passed undecorated.
        for path in ["/v1/embeddings", "/v1/responses", "/v1/completions"] {
            let req = chat_request("m", &json!({"input": "x"})).with_path(path);
            assert_eq!(decorator.on_request(&req, &mut ()).unwrap_err().code, "unsupported_endpoint", "{path}");
            assert!(!req.body_edited());
        }
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(decorator(json!({})).err().unwrap().contains("set `prepend`, `append` or both"));
        let error = decorator(json!({"append": [{"role": "tool", "content": "x"}]})).err().unwrap();
        assert_eq!(error, "prompt-decorator: append[0]: role \"tool\" is not system, developer, user or assistant");
        assert!(decorator(json!({"prepend": [{"role": "user"}]})).err().unwrap().contains("missing field `content`"));
    }
}
