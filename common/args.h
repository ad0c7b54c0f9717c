/*
 * args.h - strict parsing of command-line values.
 *
 * Every zinfer binary parses its flags with these, so a bad value is always
 * refused the same way: a message that names the flag, the value and the
 * accepted range ("--max-tokens: '-1' is not an integer in 0..1000000").
 * The server processes' options, with their ranges, are one table on top
 * of these: options.h.
 */
#ifndef ZI_ARGS_H
#define ZI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

int zi_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                 zi_error *err);
int zi_parse_float(const char *flag, const char *s, double lo, double hi, double *out,
                   zi_error *err);
/* A byte count: an integer with an optional K, M, G or T suffix (powers of
 * 1024; "512M", "2GiB" and "1g" all work). */
int zi_parse_size(const char *flag, const char *s, long long lo, long long hi, long long *out,
                  zi_error *err);
/* The value of a zinfer-worker option, checked as the worker checks it
 * (its range in options.h's table; sizes with zi_parse_size): for
 * commands that take a worker option themselves (zinfer generate's
 * --act-bits). ZI_EINVAL for a flag the worker does not take. */
int zi_parse_worker_flag(const char *flag, const char *s, long long *out, zi_error *err);
/* "1,2,3" (spaces allowed) -> malloc'd int32 array; every id in 0..max. */
int zi_parse_id_list(const char *flag, const char *s, int32_t max, int32_t **ids, size_t *n,
                     zi_error *err);

/* The default model path: $ZINFER_MODEL, else $ZINFER_HOME (default
 * ~/.cache/zinfer) + /models/SmolLM2-135M-Instruct.Q4_1.gguf. */
void zi_default_model_path(char *buf, size_t cap);

/* The value of --model: a packaged model's name (smollm2-135m,
 * gemma3-270m: the names scripts/fetch-model knows, cached in
 * $ZINFER_HOME/models) becomes that file's path, anything else is a path
 * and stays as it is. An error for a name whose file is not there yet,
 * saying which command fetches it (ZI_EIO); ZI_ERANGE for a value over cap. */
int zi_resolve_model_arg(const char *v, char *buf, size_t cap, zi_error *err);

/* The name a model file is served as by default: path's file name
 * without its directory and from ".gguf" on ("a/SmolLM2.Q4.gguf" ->
 * "SmolLM2.Q4"), cut to cap - 1 bytes. */
void zi_model_name_of_path(const char *path, char *buf, size_t cap);

#endif
