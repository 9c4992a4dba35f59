// decorator-lite in C: prepends a system message, sets a request header, and
// marks the response with `x-decorated-by: c`. JSON is tokenized with jsmn
// (Debian's libjsmn-dev, header-only); the body is edited by splicing the
// new message into the original bytes, so everything else stays as sent.
// Build: make (see the Makefile).

#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>

#include "plugin.h"

// A growing NUL-terminated string. Nothing here uses stdio, so the
// component needs no WASI at all.
typedef struct {
  char *ptr;
  size_t len;
} buf_t;

static void append(buf_t *buf, const char *text, size_t len) {
  buf->ptr = realloc(buf->ptr, buf->len + len + 1);
  memcpy(buf->ptr + buf->len, text, len);
  buf->len += len;
  buf->ptr[buf->len] = '\0';
}

static void append_str(buf_t *buf, const char *text) {
  append(buf, text, strlen(text));
}

// Set by `configure`, which the host calls first on every instance.
static char *system_json; // the "system" string as JSON text, quotes included
static char *header_name;
static char *header_value;

// A parsed JSON document: its text and tokens. Token 0 is the root.
typedef struct {
  const char *text;
  jsmntok_t *tokens;
  int count;
} json_t;

// Parses `text` (not NUL-terminated); false unless it is one JSON object.
static bool json_parse_object(json_t *doc, const char *text, size_t len) {
  jsmn_parser parser;
  jsmn_init(&parser);
  int count = jsmn_parse(&parser, text, len, NULL, 0);
  if (count < 1) return false;
  doc->text = text;
  doc->tokens = calloc(count, sizeof(jsmntok_t));
  jsmn_init(&parser);
  doc->count = jsmn_parse(&parser, text, len, doc->tokens, count);
  while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\t' || text[len - 1] == '\r' || text[len - 1] == '\n')) {
    len--;  // trailing whitespace
  }
  if (doc->count < 1 || doc->tokens[0].type != JSMN_OBJECT || doc->tokens[0].end != (int)len) {
    free(doc->tokens);
    return false;
  }
  return true;
}

// Appends code point `c` to `out` as UTF-8.
static char *put_utf8(char *out, unsigned c) {
  if (c < 0x80) {
    *out++ = c;
  } else if (c < 0x800) {
    *out++ = 0xc0 | c >> 6, *out++ = 0x80 | (c & 0x3f);
  } else if (c < 0x10000) {
    *out++ = 0xe0 | c >> 12, *out++ = 0x80 | (c >> 6 & 0x3f), *out++ = 0x80 | (c & 0x3f);
  } else {
    *out++ = 0xf0 | c >> 18, *out++ = 0x80 | (c >> 12 & 0x3f);
    *out++ = 0x80 | (c >> 6 & 0x3f), *out++ = 0x80 | (c & 0x3f);
  }
  return out;
}

static unsigned hex4(const char *digits) {
  char hex[5] = {0};
  memcpy(hex, digits, 4);
  return strtoul(hex, NULL, 16);
}

// The value of string token `i`, unescaped, as a new NUL-terminated string.
static char *json_string(const json_t *doc, int i) {
  const char *in = doc->text + doc->tokens[i].start, *end = doc->text + doc->tokens[i].end;
  char *result = malloc(end - in + 1), *out = result;
  while (in < end) {
    if (*in != '\\') {
      *out++ = *in++;
      continue;
    }
    char escape = in[1];
    in += 2;
    switch (escape) {
      case 'b': *out++ = '\b'; continue;
      case 'f': *out++ = '\f'; continue;
      case 'n': *out++ = '\n'; continue;
      case 'r': *out++ = '\r'; continue;
      case 't': *out++ = '\t'; continue;
      case 'u': break;
      default: *out++ = escape; continue;  // " \ /
    }
    unsigned c = hex4(in);
    in += 4;
    if (c >= 0xd800 && c < 0xdc00 && in[0] == '\\' && in[1] == 'u') {  // a surrogate pair
      unsigned low = hex4(in + 2);
      if (low >= 0xdc00 && low < 0xe000) {
        c = 0x10000 + ((c - 0xd800) << 10) + (low - 0xdc00);
        in += 6;
      }
    }
    out = put_utf8(out, c);
  }
  *out = '\0';
  return result;
}

// The token index of top-level field `name` of the root object, or -1.
static int json_field(const json_t *doc, const char *name) {
  for (int i = 1; i + 1 < doc->count; i++) {
    if (doc->tokens[i].parent != 0) continue;  // keys are the root's children
    char *key = json_string(doc, i);
    bool found = strcmp(key, name) == 0;
    free(key);
    if (found) return i + 1;
  }
  return -1;
}

// The string field `name`, or NULL if it is missing or not a string.
static char *json_string_field(const json_t *doc, const char *name) {
  int i = json_field(doc, name);
  return i >= 0 && doc->tokens[i].type == JSMN_STRING ? json_string(doc, i) : NULL;
}

bool exports_sluice_plugin_filter_configure(plugin_string_t *config, exports_sluice_plugin_filter_hooks_t *ret,
                                            plugin_string_t *err) {
  json_t doc;
  bool parsed = json_parse_object(&doc, (const char *)config->ptr, config->len);
  if (!parsed) {
    plugin_string_free(config);
    plugin_string_dup(err, "decorator-lite: the config is not a JSON object");
    return false;
  }
  const char *missing = NULL;
  int system = json_field(&doc, "system");
  if (system < 0 || doc.tokens[system].type != JSMN_STRING) {
    missing = "system";
  } else if (!(header_name = json_string_field(&doc, "header"))) {
    missing = "header";
  } else if (!(header_value = json_string_field(&doc, "value"))) {
    missing = "value";
  } else {
    // Keep "system" as JSON text, quotes included: it goes back into a body.
    const jsmntok_t *token = &doc.tokens[system];
    buf_t json = {0};
    append(&json, doc.text + token->start - 1, token->end - token->start + 2);
    system_json = json.ptr;
  }
  free(doc.tokens);
  plugin_string_free(config);
  if (missing) {
    buf_t message = {0};
    append_str(&message, "decorator-lite: the config needs a string \"");
    append_str(&message, missing);
    append_str(&message, "\"");
    *err = (plugin_string_t){(uint8_t *)message.ptr, message.len};
    return false;
  }
  *ret = SLUICE_PLUGIN_TYPES_HOOKS_REQUEST | SLUICE_PLUGIN_TYPES_HOOKS_RESPONSE_HEAD;
  return true;
}

// One header, as a list the host frees after the call.
static sluice_plugin_types_headers_t one_header(const char *name, const char *value) {
  sluice_plugin_types_headers_t headers = {malloc(sizeof(plugin_tuple2_string_string_t)), 1};
  plugin_string_dup(&headers.ptr[0].f0, name);
  plugin_string_dup(&headers.ptr[0].f1, value);
  return headers;
}

// A 400 with an OpenAI-shaped error; `message` is JSON-escaped already.
static void bad_request(exports_sluice_plugin_filter_request_action_t *ret, const char *message) {
  buf_t body = {0};
  append_str(&body, "{\"error\":{\"message\":\"");
  append_str(&body, message);
  append_str(&body, "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_messages\"}}");
  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_RESPOND;
  ret->val.respond = (sluice_plugin_types_direct_response_t){
      .status = 400,
      .headers = one_header("content-type", "application/json"),
      .body = {(uint8_t *)body.ptr, body.len},
  };
}

void exports_sluice_plugin_filter_request_filter(exports_sluice_plugin_filter_request_t *req,
                                                 exports_sluice_plugin_filter_request_action_t *ret) {
  const char *text = (const char *)req->body.ptr;
  json_t doc;
  int messages = -1;
  if (json_parse_object(&doc, text, req->body.len)) {
    messages = json_field(&doc, "messages");
    if (messages >= 0 && doc.tokens[messages].type != JSMN_ARRAY) messages = -1;
  }
  if (messages < 0) {
    bad_request(ret, "decorator-lite: the request body needs a \\\"messages\\\" array");
    sluice_plugin_types_request_free(req);
    return;
  }
  // Splice the system message in right after the array's `[`.
  size_t at = doc.tokens[messages].start + 1;
  buf_t body = {0};
  append(&body, text, at);
  append_str(&body, "{\"role\":\"system\",\"content\":");
  append_str(&body, system_json);
  append_str(&body, doc.tokens[messages].size > 0 ? "}," : "}");
  append(&body, text + at, req->body.len - at);
  free(doc.tokens);
  sluice_plugin_types_request_free(req);

  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_CONTINUE;
  ret->val.continue_ = (sluice_plugin_types_request_edits_t){
      .set_headers = one_header(header_name, header_value),
      .remove_headers = {NULL, 0},
      .body = {.is_some = true, .val = {(uint8_t *)body.ptr, body.len}},
  };
}

void exports_sluice_plugin_filter_response_filter(exports_sluice_plugin_filter_response_t *resp,
                                                  exports_sluice_plugin_filter_response_action_t *ret) {
  sluice_plugin_types_response_free(resp);
  ret->tag = SLUICE_PLUGIN_TYPES_RESPONSE_ACTION_CONTINUE;
  ret->val.continue_ = (sluice_plugin_types_response_edits_t){
      .set_headers = one_header("x-decorated-by", "c"),
      .remove_headers = {NULL, 0},
  };
}

// Hooks not declared by `configure`: the host never calls them.
void exports_sluice_plugin_filter_response_chunk(plugin_string_t *data, exports_sluice_plugin_filter_chunk_action_t *ret) {
  plugin_string_free(data);
  ret->tag = SLUICE_PLUGIN_TYPES_CHUNK_ACTION_PASS;
}

bool exports_sluice_plugin_filter_response_body(plugin_list_u8_t *body, plugin_list_u8_t *ret) {
  plugin_list_u8_free(body);
  return false;
}

void exports_sluice_plugin_filter_response_end(exports_sluice_plugin_filter_response_summary_t *summary) {}
