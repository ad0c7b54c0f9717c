/*
 * schema_grammar.h - a JSON Schema (response_format json_schema) written
 * as a GBNF grammar (grammar.h compiles and matches it), so that schemas
 * and grammars share one token-mask machinery.
 *
 * Supported (docs/structured_output.md has the page): `type` (a name or a
 * list of names), `properties` (in schema order; the `required` ones must
 * come, the others may be skipped), `required`, `additionalProperties`
 * (false when absent with properties, true, or a schema: extra keys, not
 * named by `properties`, after the named ones), `items`, `prefixItems`,
 * `minItems`/`maxItems`, `enum`/`const` of any JSON value (written in
 * compact form), `anyOf`/`oneOf` (any branch: oneOf's "only one" is not
 * checked), `allOf` of one schema or of object schemas (merged), `$ref` to
 * any JSON pointer in the document (`#`, `#/$defs/X`, `#/definitions/X`;
 * recursion is bounded by the grammar's stack depth, ZI_GRAMMAR_MAX_DEPTH),
 * `pattern` (regex_grammar.h's subset), `format` (date, time, date-time,
 * uuid, email, ipv4), `minLength`/`maxLength` (up to
 * ZI_SCHEMA_MAX_LENGTH), `minimum`/`maximum`/`exclusiveMinimum`/
 * `exclusiveMaximum` on integers (exact, as digit grammars) and numbers
 * (exact at integer bounds; fractional bounds narrowed to the integers
 * inside them), boolean schemas, an empty schema (any value).
 * Annotations are ignored. Anything else is refused with ZI_EUNSUPPORTED
 * naming the keyword and its JSON pointer; a document that is not JSON or
 * not a schema is ZI_EINVAL.
 *
 * Whitespace: none before the value; between tokens of a container at
 * most one newline and 20 spaces or tabs, or one space (as llama.cpp).
 * Integers and integer parts have at most 16 digits, fractions 16,
 * exponents 3.
 */
#ifndef ZI_SCHEMA_GRAMMAR_H
#define ZI_SCHEMA_GRAMMAR_H

#include <stddef.h>

#include "regex_grammar.h"
#include "zi_error.h"

#define ZI_SCHEMA_MAX_TEXT (256 * 1024) /* bytes of schema text */
#define ZI_SCHEMA_MAX_NESTING 64        /* subschemas inside each other (not via $ref) */
#define ZI_SCHEMA_MAX_ENUM 1024         /* values in one enum */
#define ZI_SCHEMA_MAX_LENGTH 1000       /* minLength, maxLength, minItems, maxItems */

/* Writes the GBNF grammar (root rule `root`) of the schema's JSON text
 * text[0..len) into out (zero-initialised by the caller, freed by it).
 * Errors start with "response_format.json_schema". */
int zi_schema_to_gbnf(const char *text, size_t len, zi_gbnf_buf *out, zi_error *err);

/* The grammar of any JSON object (response_format json_object). */
int zi_schema_any_object_gbnf(zi_gbnf_buf *out, zi_error *err);

#endif
