//! Authorizes MCP tool calls per consumer (WIT 0.3.3): the first rule whose
//! `consumers` match the caller decides which tools it may call, and calls
//! to some tools get arguments forced into them. Chat requests and MCP
//! messages other than `tools/call` pass untouched.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_plugin_sdk::ModelPattern as Glob;
use sluice_plugin_sdk::prelude::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    rules: Vec<RuleConfig>,
    /// For requests without a consumer (no auth phase, or one that named
    /// nobody). Absent: they are denied every tool.
    anonymous: Option<ToolsConfig>,
    /// Tool name → members set in its calls' `arguments`, over the client's.
    #[serde(default)]
    arguments: BTreeMap<String, Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleConfig {
    consumers: Vec<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsConfig {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// Which tools a caller may call: those `allow` matches and `deny` does not.
#[derive(Debug)]
struct Tools {
    allow: Vec<Glob>,
    deny: Vec<Glob>,
}

impl Tools {
    fn allows(&self, tool: &str) -> bool {
        !self.deny.iter().any(|glob| glob.matches(tool)) && self.allow.iter().any(|glob| glob.matches(tool))
    }
}

#[derive(Debug)]
struct Rule {
    consumers: Vec<Glob>,
    tools: Tools,
}

#[derive(Debug)]
struct McpPolicy {
    rules: Vec<Rule>,
    anonymous: Option<Tools>,
    arguments: BTreeMap<String, Map<String, Value>>,
}

/// The globs of a config list, each non-empty; `at` names the list in errors.
fn globs(patterns: Vec<String>, at: &str) -> Result<Vec<Glob>, String> {
    patterns
        .into_iter()
        .enumerate()
        .map(|(i, pattern)| {
            if pattern.is_empty() {
                Err(format!("`{at}[{i}]` is empty: a pattern names at least one character, or is `*`"))
            } else {
                Ok(Glob::new(&pattern))
            }
        })
        .collect()
}

fn tools(config: ToolsConfig, at: &str) -> Result<Tools, String> {
    Ok(Tools { allow: globs(config.allow, &format!("{at}.allow"))?, deny: globs(config.deny, &format!("{at}.deny"))? })
}

impl Plugin for McpPolicy {
    const NAME: &'static str = "mcp-policy";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.rules.is_empty() && config.anonymous.is_none() {
            return Err("`rules` is empty and there is no `anonymous`: every tool call would be denied".into());
        }
        let mut rules = Vec::with_capacity(config.rules.len());
        for (i, rule) in config.rules.into_iter().enumerate() {
            let at = format!("rules[{i}]");
            if rule.consumers.is_empty() {
                return Err(format!("`{at}.consumers` is empty: the rule would match no one"));
            }
            let consumers = globs(rule.consumers, &format!("{at}.consumers"))?;
            let tools = tools(ToolsConfig { allow: rule.allow, deny: rule.deny }, &at)?;
            rules.push(Rule { consumers, tools });
        }
        let anonymous = config.anonymous.map(|anonymous| tools(anonymous, "anonymous")).transpose()?;
        for (tool, forced) in &config.arguments {
            if tool.is_empty() {
                return Err("`arguments` has an empty tool name".into());
            }
            if forced.is_empty() {
                return Err(format!("`arguments.{tool}` is empty: it would force nothing"));
            }
        }
        Ok(McpPolicy { rules, anonymous, arguments: config.arguments })
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        // Two calls for every MCP message, one for a chat request.
        if !req.is_mcp() || req.mcp_method().as_deref() != Some("tools/call") {
            return Ok(Action::Continue);
        }
        let consumer = req.consumer();
        // A call that names no tool is denied: `*` would match it.
        let tool = req.tool_name().unwrap_or_default();
        if tool.is_empty() || !self.allows(consumer.as_deref(), &tool) {
            let fields = [("tool", tool.as_str()), ("consumer", consumer.as_deref().unwrap_or("-"))];
            host::log(LogLevel::Info, "tool call denied", &fields);
            return Ok(denied(&tool, consumer.as_deref()));
        }
        if let Some(forced) = self.arguments.get(&tool) {
            force_arguments(req, forced)?;
        }
        Ok(Action::Continue)
    }
}

impl McpPolicy {
    /// Whether `consumer` (none: anonymous) may call `tool`: the first rule
    /// naming the consumer decides; no rule, no call.
    fn allows(&self, consumer: Option<&str>, tool: &str) -> bool {
        let tools = match consumer {
            Some(consumer) => self
                .rules
                .iter()
                .find(|rule| rule.consumers.iter().any(|glob| glob.matches(consumer)))
                .map(|r| &r.tools),
            None => self.anonymous.as_ref(),
        };
        tools.is_some_and(|tools| tools.allows(tool))
    }
}

/// Sets `forced`'s members in the call's arguments, unless they hold them
/// already.
fn force_arguments(req: &Request, forced: &Map<String, Value>) -> Result<(), ApiError> {
    let mut arguments = req.tool_arguments_json()?.unwrap_or_default();
    if forced.iter().all(|(name, value)| arguments.get(name) == Some(value)) {
        return Ok(());
    }
    for (name, value) in forced {
        arguments.insert(name.clone(), value.clone());
    }
    req.set_tool_arguments_json(&arguments);
    Ok(())
}

/// The 403 the gateway turns into the JSON-RPC error of the call.
fn denied(tool: &str, consumer: Option<&str>) -> Action {
    let message = match consumer {
        Some(consumer) => format!("tool `{tool}` is not allowed for consumer `{consumer}`"),
        None => format!("tool `{tool}` is not allowed without a consumer"),
    };
    let body = serde_json::json!({"error": {"message": message, "type": "permission_denied", "code": "tool_denied"}});
    Action::respond(403, &[("content-type", "application/json")], body.to_string())
}

export_plugin!(McpPolicy);

#[cfg(test)]
mod tests;
