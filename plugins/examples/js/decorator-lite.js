// decorator-lite in JavaScript: sets a request header, prepends a system
// message, and marks the response with `x-decorated-by: javascript`. The
// request is the host's: the plugin edits it through its methods (camelCase,
// an `err` result is thrown) and never parses the body. It declares only the
// `request` hook, so the host keeps no instance across the upstream call.
// Build: npm ci && node build.mjs OUT.wasm

// Set by `configure`, which the host calls first on every instance.
let config;

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

// What `configure` throws to return `err(message)`: componentize-js returns
// a thrown value's own `payload` as the error (a plain Error would trap).
class ConfigError extends Error {
  constructor(message) {
    super(message);
    this.payload = message;
  }
}

const isObject = (value) => typeof value === "object" && value !== null && !Array.isArray(value);

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
  configure(configJson) {
    const parsed = parseJson(configJson);
    if (!isObject(parsed)) {
      throw new ConfigError("decorator-lite: the config is not a JSON object");
    }
    for (const field of ["system", "header", "value"]) {
      if (typeof parsed[field] !== "string") {
        throw new ConfigError(`decorator-lite: the config needs a string "${field}"`);
      }
    }
    config = parsed;
    return { request: true };
  },

  requestFilter(req) {
    // Counting is the cheap way to ask whether the body is a chat request.
    try {
      req.messageCount();
    } catch {
      return badRequest('decorator-lite: the request body needs a "messages" array');
    }
    req.setHeader(config.header, config.value);
    req.spliceMessages(0, 0, [{ role: "system", content: { tag: "text", val: config.system }, extra: "{}" }]);
    req.setResponseHeader("x-decorated-by", "javascript");
    return { tag: "continue" };
  },

  // Hooks not declared by `configure`: the host never calls them.
  responseFilter(_resp) {
    return { tag: "continue", val: { setHeaders: [], removeHeaders: [] } };
  },
  responseChunk(_data) {
    return { tag: "pass" };
  },
  responseBody(_body) {
    return undefined;
  },
  responseEnd(_summary) {},
};
