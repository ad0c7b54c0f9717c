/*
 * compare_backends.c - the same model file on the CPU backend and on a
 * device, compared: logits at every position of a few prompts (KL
 * divergence) and greedy continuations (token by token, with the gap
 * between the two best logits where they part, so a difference at a
 * near-tie is told apart from a wrong kernel).
 *
 *   compare_backends --model PATH [--device cuda] [--prompts 3]
 *                    [--prompt-len 48] [--gen 32] [--seed 1]
 *                    [--write-fixture FILE | --fixture FILE]
 *
 * Prompts are token ids drawn from --seed (no tokenizer needed: it runs on
 * random-weight files too). Each prompt is prefilled in one pass with every
 * position's logits kept, then decoded greedily one token per pass on each
 * backend separately. --write-fixture runs the CPU side only and writes its
 * greedy tokens and best logits (made on one machine, checked on another by
 * --fixture: the CPU backend there must give the same tokens, and the
 * device's are compared with them too).
 *
 * Prints one line per prompt and one JSON line last:
 *   {"model", "device", "positions", "mean_kl", "max_kl", "prefill_mean_kl",
 *    "decode_mean_kl", "greedy_equal", "prompts", "near_tie_divergences",
 *    "other_divergences", "fixture_cpu_equal", "fixture_device_equal"}
 * Exit status 0 when the mean KL is below --max-kl (default 1e-4) and every
 * divergence starts at a near-tie (CPU gap below --tie-gap, default 0.02,
 * in logits), 1 otherwise, 2 for bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "backend_select.h"
#include "kv_fixed.h"
#include "model.h"
#include "sampler.h"

#define MAX_PROMPTS 16
#define MAX_GEN 256

typedef struct side {
    zi_backend *be;
    zi_model *m;
} side;

typedef struct run {
    int32_t tok[MAX_GEN];
    float gap[MAX_GEN];  /* best - second best logit at each step */
    float best[MAX_GEN]; /* the best logit */
} run;

static int die(const char *what, const zi_error *err) {
    fprintf(stderr, "compare_backends: %s: %s\n", what, err->msg);
    return 2;
}

static int32_t argmax_gap(const float *x, int n, float *gap) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    *gap = x[b] - second;
    return b;
}

static double kl(const float *p_logits, const float *q_logits, int V) {
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, d = 0;
    for (int i = 0; i < V; i++) {
        if (p_logits[i] > mp) mp = p_logits[i];
        if (q_logits[i] > mq) mq = q_logits[i];
    }
    for (int i = 0; i < V; i++) zp += exp(p_logits[i] - mp), zq += exp(q_logits[i] - mq);
    double lzp = log(zp), lzq = log(zq);
    for (int i = 0; i < V; i++) {
        double lp = p_logits[i] - mp - lzp, lq = q_logits[i] - mq - lzq;
        d += exp(lp) * (lp - lq);
    }
    return d;
}

/* Prefill ids (every position's logits into lg) then greedy steps; the
 * logits of each step go to steps[g] when steps is not NULL. */
static int generate(side *s, const int32_t *ids, int n, int gen, float *lg, float *steps, run *out,
                    zi_error *err) {
    int V = zi_model_get_config(s->m)->n_vocab;
    zi_kv_fixed kv;
    int rc = zi_kv_fixed_create(s->m, 1, n + gen + 1, &kv, err);
    if (rc) return rc;
    int32_t pos[512], seq[512] = {0};
    uint8_t want[512];
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = 1;
    zi_batch b = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = seq, .want_logits = want};
    zi_kv_fixed_use(&kv, &b);
    float *last = malloc(sizeof(float) * (size_t)V);
    if (!last) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc) rc = zi_model_forward(s->m, kv.kv, &b, lg, err);
    if (!rc) memcpy(last, lg + (size_t)(n - 1) * V, sizeof(float) * (size_t)V);
    for (int g = 0; g < gen && !rc; g++) {
        out->tok[g] = argmax_gap(last, V, &out->gap[g]);
        out->best[g] = last[out->tok[g]];
        if (steps) memcpy(steps + (size_t)g * V, last, sizeof(float) * (size_t)V);
        int32_t p = n + g;
        zi_batch d = {.n_tokens = 1, .tokens = &out->tok[g], .pos = &p, .seq = seq};
        zi_kv_fixed_use(&kv, &d);
        if (g + 1 < gen) rc = zi_model_forward(s->m, kv.kv, &d, last, err);
    }
    free(last);
    zi_kv_fixed_free(&kv);
    return rc;
}

static int load(const char *device, const char *model, side *s, zi_error *err) {
    int rc = zi_backend_create_for_device(device, 0, 0, &s->be, err);
    if (!rc) rc = zi_model_load(model, s->be, &s->m, err);
    return rc;
}

int main(int argc, char **argv) {
    const char *device = "cuda", *model = NULL, *fix_out = NULL, *fix_in = NULL;
    long long P = 3, N = 48, G = 32, seed = 1;
    double max_kl = 1e-4, tie_gap = 0.02;
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long iv;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: compare_backends --model PATH [--device cuda] [--prompts N] "
                   "[--prompt-len N] [--gen N] [--seed S] [--max-kl X] [--tie-gap X] "
                   "[--write-fixture FILE | --fixture FILE]\n");
            return 0;
        } else if (!v) {
            fprintf(stderr, "compare_backends: %s needs a value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--device")) {
            device = v;
        } else if (!strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--write-fixture")) {
            fix_out = v;
        } else if (!strcmp(a, "--fixture")) {
            fix_in = v;
        } else if (!strcmp(a, "--prompts")) {
            if (!(rc = zi_parse_int(a, v, 1, MAX_PROMPTS, &iv, &err))) P = iv;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!(rc = zi_parse_int(a, v, 1, 256, &iv, &err))) N = iv;
        } else if (!strcmp(a, "--gen")) {
            if (!(rc = zi_parse_int(a, v, 1, MAX_GEN, &iv, &err))) G = iv;
        } else if (!strcmp(a, "--seed")) {
            if (!(rc = zi_parse_int(a, v, 0, 1LL << 40, &iv, &err))) seed = iv;
        } else if (!strcmp(a, "--max-kl")) {
            max_kl = atof(v);
        } else if (!strcmp(a, "--tie-gap")) {
            tie_gap = atof(v);
        } else {
            fprintf(stderr, "compare_backends: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "compare_backends: %s\n", err.msg);
            return 2;
        }
        i++;
    }
    if (!model) {
        fprintf(stderr, "compare_backends: --model is required\n");
        return 2;
    }
    side cpu = {0}, dev = {0};
    if (load("cpu", model, &cpu, &err)) return die("CPU backend", &err);
    int V = zi_model_get_config(cpu.m)->n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V * (size_t)(N > G ? N : G));
    float *lb = malloc(sizeof(float) * (size_t)V * (size_t)(N > G ? N : G));
    float *sa = malloc(sizeof(float) * (size_t)V * (size_t)G);
    float *sb = malloc(sizeof(float) * (size_t)V * (size_t)G);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)N);
    if (!la || !lb || !sa || !sb || !ids) {
        zi_error_set(&err, ZI_ENOMEM, "out of memory");
        return die("buffers", &err);
    }

    if (fix_out) { /* the CPU side alone, written down */
        FILE *f = fopen(fix_out, "w");
        if (!f) {
            zi_error_set(&err, ZI_EIO, "cannot write %s", fix_out);
            return die("fixture", &err);
        }
        fprintf(f, "zinfer-compare-fixture 1 %lld %lld %lld %lld\n", P, N, G, seed);
        for (int p = 0; p < P; p++) {
            for (int i = 0; i < N; i++)
                ids[i] = (int32_t)(zi_sampler_uniform((uint64_t)seed + (uint64_t)p * 1000003u,
                                                      (uint64_t)i) *
                                   (double)V);
            run r;
            if (generate(&cpu, ids, (int)N, (int)G, la, NULL, &r, &err))
                return die("CPU forward", &err);
            for (int g = 0; g < G; g++) fprintf(f, "%d %.6g %.6g\n", r.tok[g], r.best[g], r.gap[g]);
        }
        fclose(f);
        printf("compare_backends: wrote %s (%lld prompts x %lld tokens)\n", fix_out, P, G);
        return 0;
    }

    run fixture[MAX_PROMPTS];
    if (fix_in) {
        FILE *f = fopen(fix_in, "r");
        long long fp, fn, fg, fs;
        if (!f ||
            fscanf(f, "zinfer-compare-fixture 1 %lld %lld %lld %lld", &fp, &fn, &fg, &fs) != 4) {
            zi_error_set(&err, ZI_EFORMAT, "%s is not a compare_backends fixture", fix_in);
            return die("fixture", &err);
        }
        P = fp, N = fn, G = fg, seed = fs; /* the fixture's settings win */
        if (P > MAX_PROMPTS || G > MAX_GEN || N > 256) {
            zi_error_set(&err, ZI_EFORMAT, "%s: sizes out of range", fix_in);
            return die("fixture", &err);
        }
        for (int p = 0; p < P; p++)
            for (int g = 0; g < G; g++)
                if (fscanf(f, "%d %g %g", &fixture[p].tok[g], &fixture[p].best[g],
                           &fixture[p].gap[g]) != 3) {
                    zi_error_set(&err, ZI_EFORMAT, "%s: short (prompt %d token %d)", fix_in, p, g);
                    return die("fixture", &err);
                }
        fclose(f);
    }
    if (load(device, model, &dev, &err)) return die(device, &err);

    double sum_kl = 0, sum_pre = 0, sum_dec = 0, worst = 0;
    long n_kl = 0, n_pre = 0, n_dec = 0;
    int equal = 0, ties = 0, others = 0, fix_cpu = 0, fix_dev = 0;
    for (int p = 0; p < P; p++) {
        for (int i = 0; i < N; i++)
            ids[i] =
                (int32_t)(zi_sampler_uniform((uint64_t)seed + (uint64_t)p * 1000003u, (uint64_t)i) *
                          (double)V);
        run ra, rb;
        if (generate(&cpu, ids, (int)N, (int)G, la, sa, &ra, &err)) return die("CPU forward", &err);
        if (generate(&dev, ids, (int)N, (int)G, lb, sb, &rb, &err))
            return die("device forward", &err);
        for (int i = 0; i < N; i++) {
            double d = kl(la + (size_t)i * V, lb + (size_t)i * V, V);
            sum_pre += d, n_pre++, sum_kl += d, n_kl++;
            if (d > worst) worst = d;
        }
        int diverged = -1;
        for (int g = 0; g < G; g++) {
            if (ra.tok[g] != rb.tok[g]) {
                diverged = g;
                break;
            }
            double d = kl(sa + (size_t)g * V, sb + (size_t)g * V, V);
            sum_dec += d, n_dec++, sum_kl += d, n_kl++;
            if (d > worst) worst = d;
        }
        if (diverged < 0) {
            equal++;
            printf("prompt %d: %lld greedy tokens equal\n", p, G);
        } else {
            int tie = ra.gap[diverged] < tie_gap;
            ties += tie, others += !tie;
            printf("prompt %d: token %d differs: CPU %d (gap %.4g), device %d (gap %.4g): %s\n", p,
                   diverged, ra.tok[diverged], ra.gap[diverged], rb.tok[diverged], rb.gap[diverged],
                   tie ? "a near-tie" : "NOT a near-tie");
        }
        if (fix_in) {
            int ce = !memcmp(ra.tok, fixture[p].tok, sizeof(int32_t) * (size_t)G);
            int de = !memcmp(rb.tok, fixture[p].tok, sizeof(int32_t) * (size_t)G);
            fix_cpu += ce, fix_dev += de;
            if (!ce)
                for (int g = 0; g < G; g++)
                    if (ra.tok[g] != fixture[p].tok[g]) {
                        printf("prompt %d: this CPU differs from the fixture at token %d: %d vs "
                               "%d (fixture gap %.4g)\n",
                               p, g, ra.tok[g], fixture[p].tok[g], fixture[p].gap[g]);
                        break;
                    }
        }
    }
    double mean = n_kl ? sum_kl / (double)n_kl : 0;
    printf("{\"model\": \"%s\", \"device\": \"%s\", \"positions\": %ld, \"mean_kl\": %.3g, "
           "\"max_kl\": %.3g, \"prefill_mean_kl\": %.3g, \"decode_mean_kl\": %.3g, "
           "\"greedy_equal\": %d, \"prompts\": %lld, \"near_tie_divergences\": %d, "
           "\"other_divergences\": %d",
           model, device, n_kl, mean, worst, n_pre ? sum_pre / (double)n_pre : 0,
           n_dec ? sum_dec / (double)n_dec : 0, equal, P, ties, others);
    if (fix_in)
        printf(", \"fixture_cpu_equal\": %d, \"fixture_device_equal\": %d", fix_cpu, fix_dev);
    printf("}\n");
    zi_model_free(dev.m);
    zi_backend_free(dev.be);
    zi_model_free(cpu.m);
    zi_backend_free(cpu.be);
    free(la), free(lb), free(sa), free(sb), free(ids);
    return mean < max_kl && others == 0 && (!fix_in || fix_cpu == P) ? 0 : 1;
}
