/*
 * bench_cuda.c - decode and prefill speed of the model on a device, through
 * the same zi_model_forward the engine uses (logits come back to the host
 * every step, as the generator gets them today).
 *
 *   bench_cuda [--device cuda:0] [--model PATH] [--prompt-tokens 512]
 *              [--gen-tokens 128] [--streams 64] [--stream-prompt 64]
 *
 * Measures, after a warm-up pass:
 *   prefill   one sequence of --prompt-tokens tokens in one forward pass
 *   decode_b1 --gen-tokens greedy steps of that sequence, one token per pass
 *   decode_bS --streams sequences (each prefilled with --stream-prompt
 *             tokens) decoding together, one pass of S tokens per step;
 *             aggregate tokens per second
 * and prints one JSON line last:
 *   {"device": ..., "prefill_tok_s": ..., "decode_b1_tok_s": ...,
 *    "decode_batch": S, "decode_batch_tok_s": ...}
 * Works with --device cpu too (the same numbers for the CPU backend).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "backend_select.h"
#include "kv_fixed.h"
#include "model.h"
#include "sampler.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int die(const char *what, const zi_error *err) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    char model[4096];
    zi_default_model_path(model, sizeof model);
    long long P = 512, G = 128, S = 64, SP = 64;
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long iv;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: bench_cuda [--device D] [--model PATH] [--prompt-tokens P] "
                   "[--gen-tokens G] [--streams S] [--stream-prompt N]\n");
            return 0;
        } else if (!strcmp(a, "--device") && v) {
            device = v;
        } else if (!strcmp(a, "--model") && v) {
            snprintf(model, sizeof model, "%s", v);
        } else if (!strcmp(a, "--prompt-tokens")) {
            if (!(rc = zi_parse_int(a, v, 1, 8192, &iv, &err))) P = iv;
        } else if (!strcmp(a, "--gen-tokens")) {
            if (!(rc = zi_parse_int(a, v, 1, 8192, &iv, &err))) G = iv;
        } else if (!strcmp(a, "--streams")) {
            if (!(rc = zi_parse_int(a, v, 1, 1024, &iv, &err))) S = iv;
        } else if (!strcmp(a, "--stream-prompt")) {
            if (!(rc = zi_parse_int(a, v, 1, 4096, &iv, &err))) SP = iv;
        } else {
            fprintf(stderr, "bench_cuda: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "bench_cuda: %s\n", err.msg);
            return 2;
        }
        i++;
    }
    zi_backend *be = NULL;
    zi_model *m = NULL;
    if (zi_backend_create_for_device(device, 0, 0, &be, &err)) return die("backend", &err);
    if (zi_model_load(model, be, &m, &err)) return die("model", &err);
    int V = zi_model_get_config(m)->n_vocab;
    int ctx = (int)(P + G + 8), sctx = (int)(SP + G + 8);
    int rows = S > 1 ? (int)S : 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P > S * SP ? P : S * SP));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(P > S * SP ? P : S * SP));
    int32_t *seq = calloc((size_t)(P > S * SP ? P : S * SP), sizeof(int32_t));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows);
    uint8_t *want = malloc((size_t)rows);
    float *logits = malloc(sizeof(float) * (size_t)V * rows);
    if (!ids || !pos || !seq || !tok || !want || !logits) {
        zi_error_set(&err, ZI_ENOMEM, "out of memory");
        return die("buffers", &err);
    }
    for (long long i = 0; i < (P > S * SP ? P : S * SP); i++)
        ids[i] = (int32_t)(zi_sampler_uniform(12345, (uint64_t)i) * (double)V);

    /* one sequence: warm-up, prefill, greedy decode */
    zi_kv_fixed kv;
    if (zi_kv_fixed_create(m, 1, ctx, &kv, &err)) return die("KV cache", &err);
    for (int i = 0; i < P; i++) pos[i] = i, seq[i] = 0;
    zi_batch b = {.n_tokens = (int)P, .tokens = ids, .pos = pos, .seq = seq};
    zi_kv_fixed_use(&kv, &b);
    if (zi_model_forward(m, kv.kv, &b, logits, &err)) return die("warm-up", &err);
    double t0 = now_s();
    if (zi_model_forward(m, kv.kv, &b, logits, &err)) return die("prefill", &err);
    double t_prefill = now_s() - t0;
    int32_t t1 = argmax(logits, V), p1;
    t0 = now_s();
    for (int g = 0; g < G; g++) {
        p1 = (int32_t)(P + g);
        zi_batch d = {.n_tokens = 1, .tokens = &t1, .pos = &p1, .seq = seq};
        zi_kv_fixed_use(&kv, &d);
        if (zi_model_forward(m, kv.kv, &d, logits, &err)) return die("decode", &err);
        t1 = argmax(logits, V);
    }
    double t_b1 = now_s() - t0;
    zi_kv_fixed_free(&kv);

    /* S sequences decoding together */
    if (zi_kv_fixed_create(m, (int)S, sctx, &kv, &err)) return die("KV cache (streams)", &err);
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < SP; i++) pos[i] = i, seq[i] = s;
        zi_batch pb = {.n_tokens = (int)SP, .tokens = ids + (size_t)s * SP, .pos = pos, .seq = seq};
        zi_kv_fixed_use(&kv, &pb);
        if (zi_model_forward(m, kv.kv, &pb, logits, &err)) return die("stream prefill", &err);
        tok[s] = argmax(logits, V);
        want[s] = 1;
    }
    double t_bs = 0;
    for (int g = 0; g < G; g++) {
        for (int s = 0; s < S; s++) pos[s] = (int32_t)(SP + g), seq[s] = s;
        zi_batch d = {
            .n_tokens = (int)S, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        zi_kv_fixed_use(&kv, &d);
        double ts = now_s();
        if (zi_model_forward(m, kv.kv, &d, logits, &err)) return die("batched decode", &err);
        t_bs += now_s() - ts;
        for (int s = 0; s < S; s++) tok[s] = argmax(logits + (size_t)s * V, V);
    }
    zi_kv_fixed_free(&kv);
    if (be->ops->sync(be, &err)) return die("device", &err);

    printf("{\"device\": \"%s\", \"backend\": \"%s\", \"prompt_tokens\": %lld, "
           "\"prefill_tok_s\": %.1f, \"gen_tokens\": %lld, \"decode_b1_tok_s\": %.1f, "
           "\"decode_batch\": %lld, \"decode_batch_tok_s\": %.1f}\n",
           device, be->ops->name, P, (double)P / t_prefill, G, (double)G / t_b1, S,
           (double)(S * G) / t_bs);
    zi_model_free(m);
    zi_backend_free(be);
    free(ids);
    free(pos);
    free(seq);
    free(tok);
    free(want);
    free(logits);
    return 0;
}
