// {{name}}: a Sluice plugin, written by `sluice plugin new`. It uses every
// hook, each with a small visible effect, so you can see where your own logic
// goes; delete what you do not need.
//
// - `configure` reads the GatewayPlugin's `config` (`{"value": "...",
//   "system": "..."}`) and declares the hooks;
// - the request hook sets the request header `x-{{name}}` to `value`, puts a
//   system message first if `system` is set, and answers 400 itself when the
//   body has no `messages`;
// - the response hooks set the response header `x-{{name}}`, add
//   `"sluice_plugin": "{{name}}"` to the JSON body (or to each streamed
//   event), and log a line when the response ends.
//
// The bindings follow the WIT: methods in camelCase, variants as
// `{tag, val}`, flags as `{request: true, ...}`, `list<u8>` as a Uint8Array,
// an `option` as a value or `undefined`, an `err` result thrown.
// Build: make (componentize-js; see build.mjs).

import { log } from "sluice:plugin/host@{{wit_version}}";

const NAME = "{{name}}";
const HEADER = "x-{{name}}";

// Set by `configure`. The host snapshots the instance after `configure` and
// starts every later instance from that snapshot, so this is set once per
// plugin version, not per request.
let config;

// What `configure` throws to return `err(message)`: componentize-js returns
// a thrown value's own `payload` as the error (a plain Error would trap).
class ConfigError extends Error {
  constructor(message) {
    super(message);
    this.payload = message;
  }
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

const isObject = (value) => typeof value === "object" && value !== null && !Array.isArray(value);

// The JSON object in `text` with "sluice_plugin": NAME added, as text;
// undefined if it is not a JSON object.
function marked(text) {
  const value = parseJson(text);
  if (!isObject(value)) {
    return undefined;
  }
  value.sluice_plugin = NAME;
  return JSON.stringify(value);
}

// A 400 in OpenAI's error shape, sent by the plugin instead of forwarding.
function badRequest(message) {
  const error = { message, type: "invalid_request_error", param: null, code: "invalid_messages" };
  return {
    tag: "respond",
    val: {
      status: 400,
      headers: [["content-type", "application/json"]],
      body: new TextEncoder().encode(JSON.stringify({ error })),
    },
  };
}

export const filter = {
  // Called once per plugin version with `spec.config` as JSON. A thrown
  // ConfigError rejects the config: the message shows in /admin/config and
  // the log.
  configure(configJson) {
    const parsed = parseJson(configJson);
    if (!isObject(parsed) || typeof parsed.value !== "string") {
      throw new ConfigError(`${NAME}: the config needs a string "value"`);
    }
    if (parsed.system !== undefined && typeof parsed.system !== "string") {
      throw new ConfigError(`${NAME}: "system" must be a string`);
    }
    config = parsed;
    // The host calls only the hooks declared here. Declaring only `request`
    // is cheapest: no instance is kept across the upstream call.
    return { request: true, responseHead: true, responseChunk: true, responseBody: true, responseEnd: true };
  },

  // Before the request is forwarded. `req` is the host's request: read only
  // what you need, and edit it in place.
  requestFilter(req) {
    // Counting is the cheap way to ask whether the body is a chat request.
    try {
      req.messageCount();
    } catch {
      return badRequest(`${NAME}: the request body needs a "messages" array`);
    }
    req.setHeader(HEADER, config.value);
    if (config.system) {
      req.spliceMessages(0, 0, [{ role: "system", content: { tag: "text", val: config.system }, extra: "{}" }]);
    }
    return { tag: "continue" };
  },

  // The upstream's status and headers.
  responseFilter(_resp) {
    return { tag: "continue", val: { setHeaders: [[HEADER, config.value]], removeHeaders: [] } };
  },

  // Each `data:` payload of a streamed (text/event-stream) response.
  responseChunk(data) {
    const json = marked(data);
    return json === undefined ? { tag: "pass" } : { tag: "replace", val: json }; // pass: `[DONE]`
  },

  // The whole body of a response that is not streamed; bytes replace it.
  responseBody(body) {
    const json = marked(new TextDecoder().decode(body));
    return json === undefined ? undefined : new TextEncoder().encode(json);
  },

  // Once the response is over: for accounting and logs.
  responseEnd(summary) {
    const tokens = summary.usage === undefined ? "unknown" : String(summary.usage.totalTokens);
    log("info", `${NAME}: response ended`, [
      ["status", String(summary.status)],
      ["total_tokens", tokens],
    ]);
  },
};
