// fetch-check: asks a checker service about each request with `fetch`, the
// way any JavaScript would, and passes the answer on. Config:
// `{"url": "<checker URL>"}`; the GatewayPlugin must grant that origin
// (`spec.egress`). The checker answering `deny` refuses the request (403);
// any other answer becomes the request header
// `x-checked: <status> <body, trimmed, at most 64 bytes>`, and a failed
// call `x-checked: error <message>`.
// Build: node build.mjs OUT.wasm

let config;

class ConfigError extends Error {
  constructor(message) {
    super(message);
    this.payload = message;
  }
}

// At most `max` UTF-8 bytes of `text`, on a character boundary, with
// control characters (which a header cannot carry) as spaces.
function clip(text, max) {
  let out = "";
  let bytes = 0;
  for (const ch of text.replace(/[\u0000-\u001f\u007f]/g, " ")) {
    const size = new TextEncoder().encode(ch).length;
    if (bytes + size > max) break;
    out += ch;
    bytes += size;
  }
  return out;
}

export const filter = {
  configure(configJson) {
    let parsed;
    try {
      parsed = JSON.parse(configJson);
    } catch {}
    if (typeof parsed?.url !== "string") {
      throw new ConfigError('fetch-check: the config needs a string "url"');
    }
    config = parsed;
    return { request: true };
  },

  // A sync export in the WIT: componentize-js runs the event loop until the
  // returned promise settles, so `await fetch(...)` just works.
  async requestFilter(req) {
    let checked;
    try {
      const response = await fetch(config.url, { headers: { "x-path": req.path() } });
      const body = (await response.text()).trim();
      if (body === "deny") {
        return { tag: "respond", val: { status: 403, headers: [], body: new Uint8Array() } };
      }
      checked = `${response.status} ${clip(body, 64)}`;
    } catch (error) {
      checked = `error ${clip(String(error?.message ?? error), 200)}`;
    }
    req.setHeader("x-checked", checked.trim());
    return { tag: "continue" };
  },

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
