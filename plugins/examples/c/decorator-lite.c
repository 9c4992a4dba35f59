// decorator-lite in C: sets a request header, prepends a system message, and
// marks the response with `x-decorated-by: c`. The request is the host's:
// the plugin edits it through its methods (sluice_plugin_types_method_request_*)
// and never parses the body. Only the config is JSON, tokenized with jsmn
// (Debian's libjsmn-dev, header-only). It declares only the `request` hook,
// so the host keeps no instance across the upstream call.
// Build: make (see the Makefile; the bindings drop the borrowed request
// handle on return, `--autodrop-borrows yes`).

#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>

#include "plugin.h"

// Set by `configure`, which the host calls first on every instance.
static plugin_string_t system_text, header_name, header_value;

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
  if (!json_string_field(&doc, "system", &system_text)) {
    missing = "system";
  } else if (!json_string_field(&doc, "header", &header_name)) {
    missing = "header";
  } else if (!json_string_field(&doc, "value", &header_value)) {
    missing = "value";
  }
  free(doc.tokens);
  plugin_string_free(config);
  if (missing) {
    char message[64] = "decorator-lite: the config needs a string \"";
    strcat(strcat(message, missing), "\"");
    plugin_string_dup(err, message);
    return false;
  }
  *ret = SLUICE_PLUGIN_TYPES_HOOKS_REQUEST;
  return true;
}

// A 400 with an OpenAI-shaped error. The host frees the lists after the call.
static void bad_request(exports_sluice_plugin_filter_request_action_t *ret) {
  static const char body[] =
      "{\"error\":{\"message\":\"decorator-lite: the request body needs a \\\"messages\\\" array\","
      "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_messages\"}}";
  sluice_plugin_types_headers_t headers = {malloc(sizeof(plugin_tuple2_string_string_t)), 1};
  plugin_string_dup(&headers.ptr[0].f0, "content-type");
  plugin_string_dup(&headers.ptr[0].f1, "application/json");
  plugin_list_u8_t bytes = {malloc(sizeof body - 1), sizeof body - 1};
  memcpy(bytes.ptr, body, bytes.len);
  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_RESPOND;
  ret->val.respond = (sluice_plugin_types_direct_response_t){.status = 400, .headers = headers, .body = bytes};
}

// Arguments to the request's methods are only read during the call: they
// point at static or config strings, nothing is copied or freed.
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
  sluice_plugin_types_method_request_set_header(req, &header_name, &header_value);

  sluice_plugin_types_message_t system = {.content.tag = SLUICE_PLUGIN_TYPES_CONTENT_TEXT};
  plugin_string_set(&system.role, "system");
  system.content.val.text = system_text;
  plugin_string_set(&system.extra, "{}");
  sluice_plugin_types_list_message_t insert = {&system, 1};
  sluice_plugin_types_method_request_splice_messages(req, 0, 0, &insert);

  plugin_string_t name, value;
  plugin_string_set(&name, "x-decorated-by");
  plugin_string_set(&value, "c");
  sluice_plugin_types_method_request_set_response_header(req, &name, &value);
  ret->tag = SLUICE_PLUGIN_TYPES_REQUEST_ACTION_CONTINUE;
}

// Hooks not declared by `configure`: the host never calls them.
void exports_sluice_plugin_filter_response_filter(exports_sluice_plugin_filter_response_t *resp,
                                                  exports_sluice_plugin_filter_response_action_t *ret) {
  sluice_plugin_types_response_free(resp);
  ret->tag = SLUICE_PLUGIN_TYPES_RESPONSE_ACTION_CONTINUE;
  ret->val.continue_ = (sluice_plugin_types_response_edits_t){{NULL, 0}, {NULL, 0}};
}

void exports_sluice_plugin_filter_response_chunk(plugin_string_t *data, exports_sluice_plugin_filter_chunk_action_t *ret) {
  plugin_string_free(data);
  ret->tag = SLUICE_PLUGIN_TYPES_CHUNK_ACTION_PASS;
}

bool exports_sluice_plugin_filter_response_body(plugin_list_u8_t *body, plugin_list_u8_t *ret) {
  plugin_list_u8_free(body);
  return false;
}

void exports_sluice_plugin_filter_response_end(exports_sluice_plugin_filter_response_summary_t *summary) {}
