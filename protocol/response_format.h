/*
 * response_format.h - a request's "response_format" (OpenAI's field): plain
 * text, any JSON object, or JSON that follows a schema.
 *
 * The codec carries response_format as opaque msgpack (zi_request in
 * types.h), checked only for clean strings and depth; this module reads
 * what it asks for. Whether a schema can be held to is the worker's to say
 * (structured/schema_grammar.h).
 */
#ifndef ZI_RESPONSE_FORMAT_H
#define ZI_RESPONSE_FORMAT_H

#include "types.h"
#include "zi_error.h"

/* What a request's response_format (opaque msgpack, types.h) asks for. */
enum { ZI_RF_NONE = 0, ZI_RF_JSON_OBJECT = 1, ZI_RF_JSON_SCHEMA = 2 };

/* *kind = ZI_RF_NONE when rf is absent or {"type": "text"},
 * ZI_RF_JSON_OBJECT for {"type": "json_object"}, ZI_RF_JSON_SCHEMA for
 * {"type": "json_schema", "json_schema": S}, where S is the schema or, as
 * OpenAI sends it, {"name", "schema": the schema, "strict"}; then, when
 * schema is not NULL, *schema is the schema's JSON text (malloc'd; the
 * caller frees it). ZI_EINVAL when rf is not a map with a string "type"
 * or the schema is missing, not a map, or has no JSON form (bin, ext, NaN);
 * ZI_EUNSUPPORTED for another type. Messages name the field
 * (response_format...). */
int zi_response_format_kind(const zi_bytes *rf, int *kind, char **schema, zi_error *err);

#endif
