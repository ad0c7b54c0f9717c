/*
 * test_codec_util.h - what the codec's two test files (test_codec.c,
 * test_codec_malformed.c) share: a msgpack message builder driven by a
 * format string, numpy's little-endian bytes, and the non-default values
 * the round trips and mutations start from. A header of static functions:
 * test code only.
 */
#ifndef ZI_TEST_CODEC_UTIL_H
#define ZI_TEST_CODEC_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"

#define ERR_HAS(e, s)                                                                              \
    do {                                                                                           \
        if (!strstr((e).msg, (s)))                                                                 \
            fail_msg("message \"%s\" does not contain \"%s\"", (e).msg, (s));                      \
    } while (0)

/* ---- a message builder ----------------------------------------------------- */

/*
 * build(sb, fmt, ...) packs values described by fmt, one letter each
 * (spaces ignored):
 *   M map (int n)    A array (int n)   s str (const char *)
 *   S str (const char *, size_t)       i int (long long)
 *   u uint (unsigned long long)        d float64 (double)
 *   f float32 (double)                 t true   F false   n nil
 *   b bin (const void *, size_t)       x ext (int type, const void *, size_t)
 */
static inline void vbuild(msgpack_sbuffer *sb, const char *fmt, va_list ap) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    for (const char *f = fmt; *f; f++) {
        int rc = 0;
        switch (*f) {
        case ' ':
            break;
        case 'M':
            rc = msgpack_pack_map(&pk, (size_t)va_arg(ap, int));
            break;
        case 'A':
            rc = msgpack_pack_array(&pk, (size_t)va_arg(ap, int));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            rc = msgpack_pack_str_with_body(&pk, s, strlen(s));
            break;
        }
        case 'S': {
            const char *s = va_arg(ap, const char *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_str_with_body(&pk, s, n);
            break;
        }
        case 'i':
            rc = msgpack_pack_int64(&pk, va_arg(ap, long long));
            break;
        case 'u':
            rc = msgpack_pack_uint64(&pk, va_arg(ap, unsigned long long));
            break;
        case 'd':
            rc = msgpack_pack_double(&pk, va_arg(ap, double));
            break;
        case 'f':
            rc = msgpack_pack_float(&pk, (float)va_arg(ap, double));
            break;
        case 't':
            rc = msgpack_pack_true(&pk);
            break;
        case 'F':
            rc = msgpack_pack_false(&pk);
            break;
        case 'n':
            rc = msgpack_pack_nil(&pk);
            break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_bin_with_body(&pk, p, n);
            break;
        }
        case 'x': {
            int type = va_arg(ap, int);
            const void *p = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_ext_with_body(&pk, p, n, (int8_t)type);
            break;
        }
        default:
            fail_msg("bad build letter %c", *f);
        }
        assert_int_equal(rc, 0);
    }
}

static inline void build(msgpack_sbuffer *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vbuild(sb, fmt, ap);
    va_end(ap);
}

/* Little-endian bytes of int64/int32/float32 arrays, as numpy writes them. */
static inline void le64(uint8_t *out, const int64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++) out[8 * i + b] = (uint8_t)((uint64_t)v[i] >> (8 * b));
}
static inline void le32(uint8_t *out, const int32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) out[4 * i + b] = (uint8_t)((uint32_t)v[i] >> (8 * b));
}

/* ---- values to start from -------------------------------------------------- */

static inline msgpack_sbuffer sb_new(void) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    return sb;
}

/* Parses a whole buffer (pre-scan included), failing the test on error. */
static inline void parse_ok(const msgpack_sbuffer *sb, msgpack_unpacked *u) {
    zi_error e = {0};
    int rc = zi_msgpack_parse(sb->data, sb->size, NULL, u, &e);
    if (rc) fail_msg("parse: %s", e.msg);
}

static inline zi_sampling_params odd_sampling(void) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.top_k = 40;
    sp.top_p = 0.9;
    sp.min_p = 0.05;
    sp.temperature = 0.7;
    sp.frequency_penalty = 0.5;
    sp.presence_penalty = -0.25;
    sp.repetition_penalty = 1.1;
    sp.max_new_tokens = 64;
    sp.min_new_tokens = 3;
    sp.ignore_eos = true;
    zi_str_list_push(&sp.stop, "\n\n", 2, NULL);
    zi_str_list_push(&sp.stop, "END\xc3\xa9", 5, NULL);
    zi_i32_list_push(&sp.stop_token_ids, 2, NULL);
    zi_i32_list_push(&sp.stop_token_ids, 49151, NULL);
    sp.detokenize = false;
    sp.seed = 0xfedcba9876543210ull;
    sp.logit_bias.v = malloc(2 * sizeof *sp.logit_bias.v);
    assert_non_null(sp.logit_bias.v);
    sp.logit_bias.v[0] = (zi_token_bias){49151, -100.0f};
    sp.logit_bias.v[1] = (zi_token_bias){7, 2.5f};
    sp.logit_bias.n = 2;
    return sp;
}

/* A context over prompt[0..n) with odd_sampling's parameters, with room
 * to grow (max_new_tokens 100, min_new_tokens 0). */
static inline void odd_context(zi_text_context *c, const int32_t *prompt, size_t n,
                               int64_t max_length) {
    zi_error e = {0};
    zi_sampling_params sp = odd_sampling();
    sp.max_new_tokens = 100;
    sp.min_new_tokens = 0;
    assert_int_equal(zi_text_context_init(c, prompt, n, max_length, &sp, &e), ZI_OK);
    zi_sampling_params_free(&sp);
}

/* A heap LogProbabilities of two tokens (one with a -inf alternative). */
static inline zi_logprobs *make_lp(float base) {
    zi_logprobs *lp = malloc(sizeof *lp);
    zi_logprobs_init(lp);
    int32_t ids[3] = {7, 100, 49000};
    float v[3] = {base, base - 1.0f, -INFINITY};
    zi_logprobs_push(lp, base, ids, v, 3, NULL);
    zi_logprobs_push(lp, base - 0.5f, ids, v, 1, NULL);
    return lp;
}

#endif
