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
// The functions below implement `exports_sluice_plugin_filter_*` from
// gen/plugin.h, which `wit-bindgen c` generates from wit/. Their arguments
// are yours to free; what they return must be `malloc`ed, since the
// generated code frees it after the call. The request handle is dropped
// for you when request-filter returns (`--autodrop-borrows yes`).
// Only the config is JSON here, tokenized with jsmn (header-only).
// Build: make (see the Makefile).

#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>

#include "plugin.h"

#define NAME "{{name}}"
#define HEADER "x-{{name}}"

// Set by `configure`. The host snapshots the instance after `configure` and
// starts every later instance from that snapshot, so these are set once per
// plugin version, not per request.
static plugin_string_t config_value, config_system;
static bool has_system;

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

// The value of string token `i`, unescaped, in new memory.
static plugin_string_t json_string(const json_t *doc, int i) {
  const char *in = doc->text + doc->tokens[i].start, *end = doc->text + doc->tokens[i].end;
  char *result = malloc(end - in), *out = result;
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
    if (c >= 0xd800 && c < 0xe000) c = 0xfffd;  // a lone surrogate is not UTF-8
    out = put_utf8(out, c);
  }
  return (plugin_string_t){(uint8_t *)result, out - result};
}

// The token index of top-level field `name` of the root object, or -1.
static int json_field(const json_t *doc, const char *name) {
  for (int i = 1; i + 1 < doc->count; i++) {
    if (doc->tokens[i].parent != 0) continue;  // keys are the root's children
    plugin_string_t key = json_string(doc, i);
    bool found = key.len == strlen(name) && memcmp(key.ptr, name, key.len) == 0;
    plugin_string_free(&key);
    if (found) return i + 1;
  }
  return -1;
}

// Sets `out` to string field `name`; false if it is missing or not a string.
static bool json_string_field(const json_t *doc, const char *name, plugin_string_t *out) {
  int i = json_field(doc, name);
  if (i < 0 || doc->tokens[i].type != JSMN_STRING) return false;
  *out = json_string(doc, i);
  return true;
}

// Called once per plugin version with `spec.config` as JSON. Returning false
// with `err` set rejects the config: the message shows in /admin/config and
// the log.
bool exports_sluice_plugin_filter_configure(plugin_string_t *config, exports_sluice_plugin_filter_hooks_t *ret,
                                            plugin_string_t *err) {
  const char *error = NULL;
  json_t doc;
  if (!json_parse_object(&doc, (const char *)config->ptr, config->len)) {
    error = NAME ": the config is not a JSON object";
  } else {
    int system = json_field(&doc, "system");
    if (!json_string_field(&doc, "value", &config_value)) {
      error = NAME ": the config needs a string \"value\"";
    } else if (system >= 0 && doc.tokens[system].type != JSMN_STRING) {
      error = NAME ": \"system\" must be a string";
    } else {
      has_system = json_string_field(&doc, "system", &config_system);
    }
    free(doc.tokens);
  }
  plugin_string_free(config);
  if (error) {
    plugin_string_dup(err, error);
    return false;
  }
  // The host calls only the hooks declared here. Declaring only REQUEST is
  // cheapest: no instance is kept across the upstream call.
  *ret = SLUICE_PLUGIN_TYPES_HOOKS_REQUEST | SLUICE_PLUGIN_TYPES_HOOKS_RESPONSE_HEAD |
         SLUICE_PLUGIN_TYPES_HOOKS_RESPONSE_CHUNK | SLUICE_PLUGIN_TYPES_HOOKS_RESPONSE_BODY |
         SLUICE_PLUGIN_TYPES_HOOKS_RESPONSE_END;
  return true;
}

// `n` in decimal, NUL-terminated, into `out` (room for 11 bytes).
static void decimal(uint32_t n, char *out) {
  char digits[10];
  int i = 0;
  do digits[i++] = '0' + n % 10;
  while (n /= 10);
  while (i > 0) *out++ = digits[--i];
  *out = 0;
}

// One header, in new memory.
static sluice_plugin_types_headers_t one_header(const char *name, const plugin_string_t *value) {
  sluice_plugin_types_headers_t headers = {malloc(sizeof(plugin_tuple2_string_string_t)), 1};
  plugin_string_dup(&headers.ptr[0].f0, name);
  plugin_string_dup_n(&headers.ptr[0].f1, (const char *)value->ptr, value->len);
  return headers;
}

// A 400 in OpenAI's error shape, sent by the plugin instead of forwarding.
static void bad_request(exports_sluice_plugin_filter_request_action_t *ret) {
  static const char body[] =
      "{\"error\":{\"message\":\"" NAME ": the request body needs a \\\"messages\\\" array\","
      "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_messages\"}}";
  plugin_string_t json;
  plugin_string_set(&json, "application/json");
  plugin_list_u8_t bytes = {malloc(sizeof body - 1), sizeof body - 1};
  memcpy(bytes.ptr, body, bytes.len);
  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_RESPOND;
  ret->val.respond = (sluice_plugin_types_direct_response_t){
      .status = 400, .headers = one_header("content-type", &json), .body = bytes};
}

// Before the request is forwarded. `req` is the host's request: read only
// what you need, and edit it in place. Arguments to its methods are only
// read during the call: nothing is copied or freed.
void exports_sluice_plugin_filter_request_filter(exports_sluice_plugin_filter_borrow_request_t req,
                                                 exports_sluice_plugin_filter_request_action_t *ret) {
  // Counting is the cheap way to ask whether the body is a chat request.
  uint32_t count;
  plugin_string_t why;
  if (!sluice_plugin_types_method_request_message_count(req, &count, &why)) {
    plugin_string_free(&why);
    bad_request(ret);
    return;
  }
  plugin_string_t header;
  plugin_string_set(&header, HEADER);
  sluice_plugin_types_method_request_set_header(req, &header, &config_value);
  if (has_system) {
    sluice_plugin_types_message_t message = {.content.tag = SLUICE_PLUGIN_TYPES_CONTENT_TEXT};
    plugin_string_set(&message.role, "system");
    message.content.val.text = config_system;
    plugin_string_set(&message.extra, "{}");
    sluice_plugin_types_list_message_t insert = {&message, 1};
    sluice_plugin_types_method_request_splice_messages(req, 0, 0, &insert);
  }
  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_CONTINUE;
}

// The upstream's status and headers.
void exports_sluice_plugin_filter_response_filter(exports_sluice_plugin_filter_response_t *resp,
                                                  exports_sluice_plugin_filter_response_action_t *ret) {
  sluice_plugin_types_response_free(resp);
  ret->tag = SLUICE_PLUGIN_TYPES_RESPONSE_ACTION_CONTINUE;
  ret->val.continue_ = (sluice_plugin_types_response_edits_t){one_header(HEADER, &config_value), {NULL, 0}};
}

// `json` with "sluice_plugin": NAME added as its first member, in new
// memory; false (and nothing allocated) unless it starts with `{`, as a
// JSON object does.
static bool marked(const uint8_t *json, size_t len, uint8_t **out, size_t *out_len) {
  static const char member[] = "\"sluice_plugin\":\"" NAME "\"";
  size_t start = 0;
  while (start < len && strchr(" \t\r\n", json[start])) start++;
  if (start == len || json[start] != '{') return false;
  size_t rest = start + 1;  // just after the `{`
  size_t next = rest;
  while (next < len && strchr(" \t\r\n", json[next])) next++;
  bool empty = next < len && json[next] == '}';
  *out_len = 1 + (sizeof member - 1) + (empty ? 0 : 1) + (len - rest);
  uint8_t *p = *out = malloc(*out_len);
  *p++ = '{';
  memcpy(p, member, sizeof member - 1);
  p += sizeof member - 1;
  if (!empty) *p++ = ',';
  memcpy(p, json + rest, len - rest);
  return true;
}

// Each `data:` payload of a streamed (text/event-stream) response.
void exports_sluice_plugin_filter_response_chunk(plugin_string_t *data, exports_sluice_plugin_filter_chunk_action_t *ret) {
  uint8_t *json;
  size_t len;
  if (marked(data->ptr, data->len, &json, &len)) {
    ret->tag = SLUICE_PLUGIN_TYPES_CHUNK_ACTION_REPLACE;
    ret->val.replace = (plugin_string_t){json, len};
  } else {
    ret->tag = SLUICE_PLUGIN_TYPES_CHUNK_ACTION_PASS;  // `[DONE]`
  }
  plugin_string_free(data);
}

// The whole body of a response that is not streamed; returning true with
// `ret` set replaces it.
bool exports_sluice_plugin_filter_response_body(plugin_list_u8_t *body, plugin_list_u8_t *ret) {
  bool replaced = marked(body->ptr, body->len, &ret->ptr, &ret->len);
  plugin_list_u8_free(body);
  return replaced;
}

// Once the response is over: for accounting and logs.
void exports_sluice_plugin_filter_response_end(exports_sluice_plugin_filter_response_summary_t *summary) {
  char status[8], tokens[16] = "unknown";
  decimal(summary->status, status);
  if (summary->usage.is_some) decimal(summary->usage.val.total_tokens, tokens);
  plugin_tuple2_string_string_t fields[2];
  plugin_string_set(&fields[0].f0, "status");
  plugin_string_set(&fields[0].f1, status);
  plugin_string_set(&fields[1].f0, "total_tokens");
  plugin_string_set(&fields[1].f1, tokens);
  plugin_list_tuple2_string_string_t list = {fields, 2};
  plugin_string_t message;
  plugin_string_set(&message, NAME ": response ended");
  sluice_plugin_host_log(SLUICE_PLUGIN_TYPES_LOG_LEVEL_INFO, &message, &list);
}
