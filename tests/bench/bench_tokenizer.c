/*
 * bench_tokenizer.c - measures zi_tokenizer_encode throughput on one core.
 *
 * Not a test: it builds about 10 MB of varied text deterministically (prose
 * in several scripts, code, numbers, whitespace runs, emoji, chat markup)
 * from a fixed seed, encodes it in document-sized chunks of 1-16 KiB, and
 * prints one JSON object: {"encode_mb_s": x, ...} in MiB of input text per
 * second. encode_mb_s is the best of three passes, so that a noisy neighbour
 * on the machine skews it less (the piece cache is warm after the first, as
 * in a long-running server); first_pass_mb_s is the cold first pass.
 *
 * Usage: bench_tokenizer [model.gguf] [megabytes]
 *   model defaults to $ZINFER_MODEL, then the default SmolLM2 path; a
 *   vocabulary-only file (llama.cpp's ggml-vocab-NAME.gguf) works as well,
 *   so each pre-tokenizer family can be measured on its own vocabulary.
 *   The JSON names the file and its tokenizer.ggml.pre.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const char *const k_words[] = {
    "the",     "of",        "and",      "to",
    "in",      "is",        "was",      "for",
    "that",    "with",      "model",    "server",
    "request", "token",     "latency",  "throughput",
    "memory",  "cache",     "engine",   "serving",
    "Hello",   "World",     "However",  "It's",
    "they'll", "we've",     "I'm",      "don't",
    "naïve",   "café",      "Straße",   "über",
    "Ärger",   "œuvre",     "garçon",   "déjà",
    "Москва",  "привет",    "сервер",   "данные",
    "Αθήνα",   "λόγος",     "κόσμος",   "北京",
    "模型",    "推理",      "服务器",   "東京",
    "日本語",  "トークン",  "ひらがな", "한국어",
    "서버",    "مرحبا",     "العالم",   "שלום",
    "עולם",    "नमस्ते",      "भारत",     "สวัสดี",
    "ภาษาไทย", "😀",         "👍🏽", "👨‍👩‍👧",
    "🦙",    "e\xcc\x81", "x²",       "½",
    "٣٤٥",     "Ⅻ",         "—",        "…",
    "«",       "»",         "→",        "€",
    "$",       "100%",
};

static const char *const k_snippets[] = {
    "int main(int argc, char **argv) {\n    return 0;\n}\n",
    "def f(x):\n    return [i * 2 for i in range(x)]\n",
    "{\"id\": 42, \"name\": \"zinfer\", \"tags\": [\"a\", \"b\"], \"ok\": true}\n",
    "<div class=\"box\"><p>Hello &amp; welcome</p></div>\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "    \t  \n\n\r\n   ",
    "for (size_t i = 0; i < n; i++) sum += a[i] * b[i];\n",
    "SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY name;\n",
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static char *make_text(size_t target, size_t *len) {
    char *buf = malloc(target + 4096);
    if (!buf) return NULL;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    size_t n = 0;
    while (n < target) {
        uint64_t r = rng_next(&s);
        int kind = (int)(r % 100);
        const char *piece;
        char num[64];
        if (kind < 80) {
            piece = k_words[(r >> 8) % (sizeof k_words / sizeof *k_words)];
        } else if (kind < 88) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)((r >> 8) % 10000000));
            piece = num;
        } else if (kind < 90) {
            piece = k_snippets[(r >> 8) % (sizeof k_snippets / sizeof *k_snippets)];
        } else {
            static const char *const punct[] = {".",  ",", "!",  "?",    ";",  ":",
                                                " (", ")", "\n", "\n\n", "  ", "-"};
            piece = punct[(r >> 8) % (sizeof punct / sizeof *punct)];
        }
        size_t l = strlen(piece);
        memcpy(buf + n, piece, l);
        n += l;
        if (kind < 88 && (r >> 40) % 8 != 0) buf[n++] = ' ';
    }
    *len = n;
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : getenv("ZINFER_MODEL");
    if (!model || !*model) model = DEFAULT_MODEL;
    size_t mb = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 10;
    if (mb == 0) mb = 10;

    zi_error err = {0};
    zi_gguf *g = NULL;
    zi_tokenizer *tok = NULL;
    if (zi_gguf_open(model, &g, &err) || zi_tokenizer_load(g, &tok, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        zi_gguf_close(g);
        return 1;
    }
    zi_str pre = {"", 0};
    if (zi_gguf_find_kv(g, "tokenizer.ggml.pre"))
        (void)zi_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &err);
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    size_t len;
    char *text = make_text(mb << 20, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: out of memory\n");
        return 1;
    }

    double best = 1e30, first = 0;
    size_t n_tokens = 0;
    for (int pass = 0; pass < 3; pass++) {
        uint64_t s = 12345;
        size_t off = 0, count = 0;
        double t0 = now_s();
        while (off < len) {
            size_t chunk = 1024 + (size_t)(rng_next(&s) % (15 * 1024));
            if (chunk > len - off) chunk = len - off;
            int32_t *ids;
            size_t n;
            if (zi_tokenizer_encode(tok, text + off, chunk, 0, 1, &ids, &n, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            count += n;
            free(ids);
            off += chunk;
        }
        double dt = now_s() - t0;
        if (pass == 0) first = dt;
        if (dt < best) best = dt;
        n_tokens = count;
    }
    double mib = (double)len / (1024.0 * 1024.0);
    printf("{\"model\": \"%s\", \"pre\": \"%.*s\", \"encode_mb_s\": %.2f, "
           "\"first_pass_mb_s\": %.2f, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.4f}\n",
           base, (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, mib / best, mib / first, len,
           n_tokens, best);
    free(text);
    zi_tokenizer_free(tok);
    zi_gguf_close(g);
    return 0;
}
