// decorator-lite in JavaScript: prepends a system message, sets a request
// header, and marks the response with `x-decorated-by: javascript`.
// Build: npm ci && node build.mjs OUT.wasm

// Set by `configure`, which the host calls first on every instance.
let config;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

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
      body: encoder.encode(JSON.stringify({ error })),
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
    return { request: true, responseHead: true };
  },

  requestFilter(req) {
    const body = parseJson(decoder.decode(req.body));
    if (!isObject(body) || !Array.isArray(body.messages)) {
      return badRequest('decorator-lite: the request body needs a "messages" array');
    }
    body.messages.unshift({ role: "system", content: config.system });
    return {
      tag: "continue",
      val: {
        setHeaders: [[config.header, config.value]],
        removeHeaders: [],
        body: encoder.encode(JSON.stringify(body)),
      },
    };
  },

  responseFilter(_resp) {
    return { tag: "continue", val: { setHeaders: [["x-decorated-by", "javascript"]], removeHeaders: [] } };
  },

  // Hooks not declared by `configure`: the host never calls them.
  responseChunk(_data) {
    return { tag: "pass" };
  },
  responseBody(_body) {
    return undefined;
  },
  responseEnd(_summary) {},
};
