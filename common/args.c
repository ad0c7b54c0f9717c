/*
 * args.c - see args.h.
 */
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"

int zi_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                 zi_error *err) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return zi_error_set(err, ZI_EINVAL, "%s: '%s' is not an integer in %lld..%lld", flag,
                            s ? s : "(missing)", lo, hi);
    *out = v;
    return ZI_OK;
}

int zi_parse_size(const char *flag, const char *s, long long lo, long long hi, long long *out,
                  zi_error *err) {
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    int shift = 0;
    if (s && *s && !errno && end != s) {
        switch (*end) {
        case 'K':
        case 'k':
            shift = 10, end++;
            break;
        case 'M':
        case 'm':
            shift = 20, end++;
            break;
        case 'G':
        case 'g':
            shift = 30, end++;
            break;
        case 'T':
        case 't':
            shift = 40, end++;
            break;
        default:
            break;
        }
        if (shift && *end == 'i') end++;
        if (shift && (*end == 'B' || *end == 'b')) end++;
    }
    if (!s || !*s || !end || *end || errno || end == s || v < 0 ||
        (shift && v > (LLONG_MAX >> shift)) || (v << shift) < lo || (v << shift) > hi)
        return zi_error_set(err, ZI_EINVAL,
                            "%s: '%s' is not a size in %lld..%lld bytes (suffixes K, M, G, T: "
                            "powers of 1024)",
                            flag, s ? s : "(missing)", lo, hi);
    *out = v << shift;
    return ZI_OK;
}

int zi_parse_worker_flag(const char *flag, const char *s, long long *out, zi_error *err) {
    const zi_option *o = zi_option_find(ZI_OWN_WORKER, flag, NULL);
    if (!o) return zi_error_set(err, ZI_EINVAL, "%s: not a worker option", flag);
    return zi_option_parse(o, flag, s, out, err);
}

int zi_parse_float(const char *flag, const char *s, double lo, double hi, double *out,
                   zi_error *err) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return zi_error_set(err, ZI_EINVAL, "%s: '%s' is not a number in %g..%g", flag,
                            s ? s : "(missing)", lo, hi);
    *out = v;
    return ZI_OK;
}

int zi_parse_id_list(const char *flag, const char *s, int32_t max, int32_t **ids, size_t *n,
                     zi_error *err) {
    size_t cap = 16, len = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > max) {
            free(v);
            return zi_error_set(err, ZI_EINVAL, "%s: item %zu is not a token id in 0..%d", flag,
                                len, (int)max);
        }
        if (len == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return zi_error_set(err, ZI_ENOMEM, "out of memory");
            }
            v = nv;
        }
        v[len++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',')
            p++;
        else if (*p) {
            free(v);
            return zi_error_set(err, ZI_EINVAL, "%s: expected ',' after item %zu", flag, len - 1);
        }
    }
    if (len == 0) {
        free(v);
        return zi_error_set(err, ZI_EINVAL, "%s: no token ids given", flag);
    }
    *ids = v;
    *n = len;
    return ZI_OK;
}

/* $ZINFER_HOME, else ~/.cache/zinfer, into buf. */
static void zinfer_home(char *buf, size_t cap) {
    const char *home = getenv("ZINFER_HOME");
    if (home && *home) {
        snprintf(buf, cap, "%s", home);
        return;
    }
    const char *h = getenv("HOME");
    snprintf(buf, cap, "%s/.cache/zinfer", h ? h : ".");
}

/* The packaged models, by name: keep in step with scripts/fetch-model. */
static const struct {
    const char *name, *file;
} packaged_models[] = {
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
};

int zi_resolve_model_arg(const char *v, char *buf, size_t cap, zi_error *err) {
    for (size_t i = 0; i < sizeof packaged_models / sizeof packaged_models[0]; i++) {
        if (strcmp(v, packaged_models[i].name) != 0) continue;
        char home[3072];
        zinfer_home(home, sizeof home);
        int n = snprintf(buf, cap, "%s/models/%s", home, packaged_models[i].file);
        if (n < 0 || (size_t)n >= cap)
            return zi_error_set(err, ZI_ERANGE, "--model %s: the path is too long", v);
        if (access(buf, R_OK) != 0)
            return zi_error_set(err, ZI_EIO,
                                "--model %s: %s is not there (fetch it with scripts/fetch-model "
                                "%s)",
                                v, buf, v);
        return ZI_OK;
    }
    int n = snprintf(buf, cap, "%s", v);
    if (n < 0 || (size_t)n >= cap)
        return zi_error_set(err, ZI_ERANGE, "--model: a path of %zu bytes is too long",
                            strlen(v));
    return ZI_OK;
}

void zi_default_model_path(char *buf, size_t cap) {
    const char *m = getenv("ZINFER_MODEL");
    if (m && *m) {
        snprintf(buf, cap, "%s", m);
        return;
    }
    const char *home = getenv("ZINFER_HOME");
    if (home && *home) {
        snprintf(buf, cap, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", home);
        return;
    }
    const char *h = getenv("HOME");
    snprintf(buf, cap, "%s/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf", h ? h : ".");
}

void zi_model_name_of_path(const char *path, char *buf, size_t cap) {
    const char *base = strrchr(path, '/');
    snprintf(buf, cap, "%s", base ? base + 1 : path);
    char *dot = strstr(buf, ".gguf");
    if (dot) *dot = '\0';
}
