/*
 * bench_json_constraint.c - what structured output (response_format
 * json_object, json_schema: a grammar, schema_grammar.h and grammar.h)
 * costs the worker per generated token: zi_grammar_allowed over the
 * model's whole vocabulary at typical points of a JSON text, the first
 * time at that point (a fresh state each time; later steps at the same
 * parse stacks hit the state's mask cache). The vocabulary is one for the
 * run, as in a worker: its per-class masks (class_mask.h) are computed at
 * the first timing that needs them and reused after.
 *
 * Not a test: prints one JSON object, {"vocab_build_ms": x, "states":
 * [{"after": text, "us": mean microseconds per mask, "allowed": tokens},
 * ...], "schema": ..., "schema_states": [...]} (the same under a small
 * schema), each state timed for 0.2 s on one core. Compare with a decode step
 * (zinfer bench: ~4 ms for one stream on the default model).
 *
 * Usage: bench_json_constraint [model.gguf]
 *   model defaults to $ZINFER_MODEL, then the default SmolLM2 path.
 *
 * Replay (scripts/bench-structured): bench_json_constraint --replay
 * SCHEMA_FILE IDS_FILE [model.gguf] times the mask at every step of real
 * completions: IDS_FILE has one completion a line (its token ids, spaces
 * between), each replayed from a fresh state under the schema (one
 * vocabulary for all, as in a worker), and prints {"masks": n,
 * "median_us": x, "p99_us": y, "mean_us": z, "max_us": w}.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "vocab_trie.h"
#include "grammar.h"
#include "schema_grammar.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Prints a JSON string. */
static void print_str(const char *p) {
    putchar('"');
    for (; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    putchar('"');
}

/* Times the mask after each text of after[0..n) under schema sc (NULL:
 * json_object) and prints the JSON list of results; 1 when a text is not
 * a valid prefix. */
static int time_states(const zi_grammar_vocab *v, const char *schema, const char *const *after,
                       size_t n, int32_t eos, int32_t *mask) {
    int32_t V = zi_grammar_vocab_size(v);
    zi_gbnf_buf b = {0};
    zi_grammar *gr = NULL;
    zi_error err = {0};
    if ((schema ? zi_schema_to_gbnf(schema, strlen(schema), &b, &err)
                : zi_schema_any_object_gbnf(&b, &err)) ||
        zi_grammar_compile(b.p, b.n, &gr, &err)) {
        fprintf(stderr, "bench_json_constraint: %s\n", err.msg);
        return 1;
    }
    free(b.p);
    putchar('[');
    for (size_t i = 0; i < n; i++) {
        long it = 0;
        double spent = 0, t0 = now_s(), t1;
        do {
            zi_grammar_state *s = NULL;
            bool fed = false;
            if (zi_grammar_state_create(gr, &s, NULL) ||
                zi_grammar_feed(s, (const uint8_t *)after[i], strlen(after[i]), &fed, NULL) || !fed)
                return 1;
            double a = now_s();
            if (zi_grammar_allowed(v, s, &eos, 1, mask, NULL)) return 1;
            spent += now_s() - a;
            zi_grammar_state_free(s);
            it++;
            t1 = now_s();
        } while (t1 - t0 < 0.2);
        long allowed = 0;
        for (int32_t t = 0; t < V; t++) allowed += (uint32_t)mask[t >> 5] >> (t & 31) & 1u;
        printf("%s{\"after\": ", i ? ", " : "");
        print_str(after[i]);
        printf(", \"us\": %.1f, \"allowed\": %ld}", spent / (double)it * 1e6, allowed);
    }
    putchar(']');
    zi_grammar_free(gr);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads a whole file into a NUL-terminated buffer (NULL on failure). */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    for (size_t got; p && (got = fread(p + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q) free(p);
            p = q;
        }
    }
    fclose(f);
    if (p) p[n] = 0;
    *len = n;
    return p;
}

/* The --replay mode (see the top of the file). */
static int replay(const zi_grammar_vocab *v, int32_t eos, const char *schema_path,
                  const char *ids_path) {
    size_t sn, in;
    char *schema = read_all(schema_path, &sn), *ids = read_all(ids_path, &in);
    zi_gbnf_buf b = {0};
    zi_grammar *gr = NULL;
    zi_error err = {0};
    if (!schema || !ids) {
        fprintf(stderr, "bench_json_constraint: cannot read %s or %s\n", schema_path, ids_path);
        return 1;
    }
    if (zi_schema_to_gbnf(schema, sn, &b, &err) || zi_grammar_compile(b.p, b.n, &gr, &err)) {
        fprintf(stderr, "bench_json_constraint: %s\n", err.msg);
        return 1;
    }
    int32_t V = zi_grammar_vocab_size(v);
    int32_t *mask = malloc(((size_t)V + 31) / 32 * sizeof *mask);
    size_t n = 0, cap = 1024;
    double *us = malloc(cap * sizeof *us), total = 0;
    for (char *line = ids; mask && us && line && *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        zi_grammar_state *s = NULL;
        if (zi_grammar_state_create(gr, &s, &err)) return 1;
        for (char *p = line, *q;; p = q) {
            long id = strtol(p, &q, 10);
            if (q == p) break;
            if (n == cap) {
                double *t = realloc(us, (cap *= 2) * sizeof *us);
                if (!t) return 1;
                us = t;
            }
            double a = now_s();
            bool fed = false;
            if (zi_grammar_allowed(v, s, &eos, 1, mask, NULL)) return 1;
            us[n] = (now_s() - a) * 1e6, total += us[n++];
            if (zi_grammar_feed_token(v, s, (int32_t)id, &fed, NULL)) return 1;
            if (!fed) break; /* eos or a cut */
        }
        zi_grammar_state_free(s);
        line = end ? end + 1 : NULL;
    }
    if (!mask || !us || n == 0) {
        fprintf(stderr, "bench_json_constraint: no masks replayed\n");
        return 1;
    }
    qsort(us, n, sizeof *us, cmp_double);
    printf("{\"masks\": %zu, \"median_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
           "\"max_us\": %.1f}\n",
           n, us[n / 2], us[(size_t)((double)(n - 1) * 0.99)], total / (double)n, us[n - 1]);
    free(us), free(mask), free(schema), free(ids), free(b.p);
    zi_grammar_free(gr);
    return 0;
}

int main(int argc, char **argv) {
    const char *schema_path = NULL, *ids_path = NULL;
    if (argc > 3 && !strcmp(argv[1], "--replay")) {
        schema_path = argv[2], ids_path = argv[3];
        argv += 3, argc -= 3;
    }
    const char *path = argc > 1                 ? argv[1]
                       : getenv("ZINFER_MODEL") ? getenv("ZINFER_MODEL")
                                                : DEFAULT_MODEL;
    zi_error err = {0};
    zi_gguf *g = NULL;
    zi_tokenizer *tok = NULL;
    zi_grammar_vocab *v = NULL;
    if (zi_gguf_open(path, &g, &err) || zi_tokenizer_load(g, &tok, &err)) {
        fprintf(stderr, "bench_json_constraint: %s\n", err.msg);
        return 1;
    }
    double t0 = now_s();
    if (zi_grammar_vocab_create(zi_tokenizer_vocab_size(tok), zi_tokenizer_constraint_bytes, tok,
                                &v, &err)) {
        fprintf(stderr, "bench_json_constraint: %s\n", err.msg);
        return 1;
    }
    double build_ms = (now_s() - t0) * 1e3;
    int32_t V = zi_tokenizer_vocab_size(tok), eos = zi_tokenizer_eos(tok);
    if (schema_path) {
        int rc = replay(v, eos, schema_path, ids_path);
        zi_grammar_vocab_free(v);
        zi_tokenizer_free(tok);
        zi_gguf_close(g);
        return rc;
    }
    int32_t *mask = malloc(((size_t)V + 31) / 32 * sizeof *mask);
    if (!mask) return 1;
    /* Points of a text: between values, inside keys and strings, in a
     * number, a literal, an escape. */
    static const char *const after[] = {"",
                                        "{",
                                        "{\"na",
                                        "{\"name\":",
                                        "{\"name\": \"Jo",
                                        "{\"a\": 12",
                                        "{\"a\": [1, ",
                                        "{\"a\": tr",
                                        "{\"a\": \"x\\"};
    printf("{\"vocab_build_ms\": %.1f, \"vocab\": %d, \"states\": ", build_ms, (int)V);
    if (time_states(v, NULL, after, sizeof after / sizeof after[0], eos, mask)) return 1;
    /* Under a schema: keys matched against the properties, a typed value,
     * an enum. */
    static const char schema_text[] =
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": "
        "{\"type\": \"integer\"}, \"color\": {\"enum\": [\"red\", \"green\", \"blue\"]}}, "
        "\"required\": [\"name\", \"age\"]}";
    static const char *const under[] = {
        "{", "{\"na", "{\"name\": \"Jo",
        "{\"name\": \"x\", \"age\": ", "{\"name\": \"x\", \"age\": 3, \"color\": \"gr"};
    printf(", \"schema\": ");
    print_str(schema_text);
    printf(", \"schema_states\": ");
    if (time_states(v, schema_text, under, sizeof under / sizeof under[0], eos, mask)) return 1;
    printf("}\n");
    free(mask);
    zi_grammar_vocab_free(v);
    zi_tokenizer_free(tok);
    zi_gguf_close(g);
    return 0;
}
