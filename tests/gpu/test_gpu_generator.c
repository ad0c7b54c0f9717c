/*
 * test_gpu_generator.c - the generator with the GPU sampler wired in
 * (model_worker/device_sampler.h), on a real GPU, with the default model.
 * Built only with CUDA (tests/gpu/meson.build); exits 77 without a usable
 * GPU or without the model ($ZINFER_MODEL or the default download).
 *
 * The same requests, batched with a small step budget (chunked prefill:
 * some stepped contexts have no row to sample, so sampled rows and logits
 * rows differ) and sample_vocab set to the tokenizer's vocabulary:
 *   plain    greedy
 *   pen      greedy with repetition, frequency and presence penalties
 *   mintok   greedy with min_new_tokens over EOS ids chosen to be the
 *            tokens the plain run produces (the EOS mask must bite)
 *   json     greedy under the structured-output bitmask (any JSON object)
 *   seeded   temperature 0.8, min_p 0.05, penalties, a seed; top_k/top_p off
 *   seeded2  temperature 1.0, a seed
 *
 *   - device vs host sampling on the same CUDA model (ZINFER_GPU_SAMPLER=0
 *     makes the host one): the logits are the same, so every token must be
 *     equal; tokens counted as sampled on the device (stats.device_sampled)
 *     prove the GPU path was taken (and 0 on the host run);
 *   - CPU backend vs CUDA backend with device sampling: greedy sequences
 *     equal, or diverging only at a near-tie (raw logit gap below 0.05 on
 *     both backends; the first difference is printed with both gaps);
 *     seeded ones are reported but may diverge where a draw falls within
 *     the backends' logit difference of a boundary;
 *   - a context asking for log probabilities takes the host path (no token
 *     is counted as sampled on the device) and gets the same tokens.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "args.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "device_sampler.h"
#include "generator.h"
#include "json_constraint.h"
#include "kv_fixed.h"
#include "model.h"
#include "tokenizer.h"
#include "types.h"

#define GEN 24
#define N_CASES 6

enum { PLAIN, PEN, MINTOK, JSON, SEEDED, SEEDED2 };
static const char *case_name[N_CASES] = {"plain", "pen", "mintok", "json", "seeded", "seeded2"};

static const char *texts[N_CASES] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4,",
    "<|im_start|>user\nGive me a JSON object describing a cat.<|im_end|>\n<|im_start|>"
    "assistant\n",
    "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
};

static struct {
    zi_backend *cpu, *gpu;
    zi_model *m_cpu, *m_gpu;
    zi_tokenizer *tok;
    zi_json_vocab *jv; /* NULL when the tokenizer's size is not the model's */
    int32_t *ids[N_CASES];
    size_t n_ids[N_CASES];
    int32_t mintok_eos[2]; /* set from the plain run */
} F;

typedef struct run_out {
    int32_t tok[N_CASES][GEN];
    int n[N_CASES];
    uint64_t device_sampled;
} run_out;

static void new_context(int i, zi_text_context *c) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = GEN;
    sp.ignore_eos = i != JSON && i != MINTOK;
    sp.temperature = 0.0;
    if (i == PEN || i == SEEDED) {
        sp.repetition_penalty = 1.3;
        sp.frequency_penalty = 0.4;
        sp.presence_penalty = 0.3;
    }
    if (i == MINTOK) sp.min_new_tokens = GEN;
    if (i == SEEDED || i == SEEDED2) {
        sp.temperature = i == SEEDED ? 0.8 : 1.0;
        sp.top_k = 0;
        sp.top_p = 1.0;
        sp.min_p = i == SEEDED ? 0.05 : 0.0;
        sp.seed = 4242 + (uint64_t)i;
    }
    zi_error err = {0};
    assert_int_equal(zi_text_context_init(c, F.ids[i], F.n_ids[i], 512, &sp, &err), ZI_OK);
    if (i == MINTOK) {
        assert_int_equal(zi_i32_list_set(&c->eos_token_ids, F.mintok_eos, 2, &err), ZI_OK);
    } else {
        assert_int_equal(zi_tokenizer_eog_ids(F.tok, &c->eos_token_ids, &err), ZI_OK);
    }
    if (i == JSON) {
        c->has_json_schema = true;
        assert_int_equal(zi_string_set(&c->json_schema, ZI_JSON_OBJECT_SCHEMA,
                                       strlen(ZI_JSON_OBJECT_SCHEMA), &err),
                         ZI_OK);
    }
    zi_sampling_params_free(&sp);
}

/* Runs the cases in mask together through a generator on model m (7-token
 * steps: prompts are chunked beside decodes). */
static void run(zi_model *m, const zi_json_vocab *jv, unsigned mask, int logprobs, run_out *out) {
    zi_error err = {0};
    zi_generator *g = NULL;
    zi_generator_config cfg = {.n_slots = N_CASES,
                               .ctx = 512,
                               .max_batch_tokens = 7,
                               .sample_vocab = zi_tokenizer_vocab_size(F.tok)};
    if (cfg.sample_vocab > zi_model_get_config(m)->n_vocab) cfg.sample_vocab = 0;
    if (zi_generator_create(m, &cfg, &g, &err)) fail_msg("generator: %s", err.msg);
    if (jv) assert_int_equal(zi_generator_set_json_vocab(g, jv, &err), ZI_OK);
    zi_text_context ctx[N_CASES];
    zi_text_context *live[N_CASES];
    size_t n_live = 0;
    for (int i = 0; i < N_CASES; i++) {
        if (!(mask & (1u << i))) continue;
        new_context(i, &ctx[i]);
        if (logprobs) ctx[i].log_probabilities = 2;
        live[n_live++] = &ctx[i];
    }
    for (int rounds = 0; n_live > 0 && rounds < 1000; rounds++) {
        if (zi_generator_next_token(g, live, n_live, 1, &err)) fail_msg("step: %s", err.msg);
        size_t k = 0;
        for (size_t i = 0; i < n_live; i++) {
            if (zi_text_context_is_done(live[i]))
                zi_generator_release(g, live[i]);
            else
                live[k++] = live[i];
        }
        n_live = k;
    }
    assert_int_equal(n_live, 0);
    memset(out->n, 0, sizeof out->n);
    for (int i = 0; i < N_CASES; i++) {
        if (!(mask & (1u << i))) continue;
        int64_t n = zi_text_context_generated_count(&ctx[i]);
        assert_true(n >= 1 && n <= GEN);
        out->n[i] = (int)n;
        memcpy(out->tok[i], zi_text_context_generated_tokens(&ctx[i]), (size_t)n * sizeof(int32_t));
        zi_text_context_free(&ctx[i]);
    }
    zi_generator_stats st;
    zi_generator_get_stats(g, &st);
    out->device_sampled = st.device_sampled;
    zi_generator_free(g);
}

/* The raw last-position logits of prompt i followed by gen[0..n) on m. */
static float *logits_after(zi_model *m, int i, const int32_t *gen, int n) {
    zi_error err = {0};
    int V = zi_model_get_config(m)->n_vocab, len = (int)F.n_ids[i] + n;
    int32_t *tk = malloc(sizeof(int32_t) * (size_t)len);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)len), *seq = calloc((size_t)len, 4);
    float *lg = malloc(sizeof(float) * (size_t)V);
    memcpy(tk, F.ids[i], F.n_ids[i] * sizeof(int32_t));
    memcpy(tk + F.n_ids[i], gen, (size_t)n * sizeof(int32_t));
    for (int k = 0; k < len; k++) pos[k] = k;
    zi_kv_fixed kv;
    assert_int_equal(zi_kv_fixed_create(m, 1, 512, &kv, &err), ZI_OK);
    zi_batch b = {.n_tokens = len, .tokens = tk, .pos = pos, .seq = seq};
    zi_kv_fixed_use(&kv, &b);
    if (zi_model_forward(m, kv.kv, &b, lg, &err)) fail_msg("forward: %s", err.msg);
    zi_kv_fixed_free(&kv);
    free(tk);
    free(pos);
    free(seq);
    return lg;
}

/* Compares case i of a and b; on a difference prints it with the raw
 * logit gap between the two tokens on both backends and returns that gap's
 * larger magnitude (0: equal). */
static double compare(int i, const run_out *a, const char *na, const run_out *b, const char *nb) {
    int n = a->n[i] < b->n[i] ? a->n[i] : b->n[i];
    int j = 0;
    while (j < n && a->tok[i][j] == b->tok[i][j]) j++;
    if (j == n && a->n[i] == b->n[i]) {
        print_message("%-8s equal (%d tokens)\n", case_name[i], n);
        return 0.0;
    }
    if (j == n) {
        print_message("%-8s %s stops after %d tokens, %s after %d\n", case_name[i], na, a->n[i], nb,
                      b->n[i]);
        return INFINITY;
    }
    int32_t ta = a->tok[i][j], tb = b->tok[i][j];
    float *lc = logits_after(F.m_cpu, i, a->tok[i], j);
    float *lgpu = logits_after(F.m_gpu, i, a->tok[i], j);
    double gc = (double)lc[ta] - lc[tb], gg = (double)lgpu[ta] - lgpu[tb];
    print_message("%-8s first difference at token %d: %s %d, %s %d; raw logit gap (%s's - "
                  "%s's token) CPU backend %.5f, CUDA backend %.5f\n",
                  case_name[i], j, na, ta, nb, tb, na, nb, gc, gg);
    free(lc);
    free(lgpu);
    return fabs(gc) > fabs(gg) ? fabs(gc) : fabs(gg);
}

#define ALL ((1u << N_CASES) - 1)

/* The plain run on the CPU picks the EOS ids the mintok case masks. */
static void choose_mintok_eos(void) {
    if (F.mintok_eos[0] || F.mintok_eos[1]) return;
    run_out r;
    run(F.m_cpu, F.jv, 1u << MINTOK, 0, &r); /* MINTOK's prompt, no mask yet: eos = {0, 0} */
    F.mintok_eos[0] = r.tok[MINTOK][0];
    F.mintok_eos[1] = r.tok[MINTOK][1];
}

static void test_device_vs_host_sampling(void **state) {
    (void)state;
    choose_mintok_eos();
    run_out dev, host;
    run(F.m_gpu, F.jv, ALL, 0, &dev);
    setenv("ZINFER_GPU_SAMPLER", "0", 1);
    run(F.m_gpu, F.jv, ALL, 0, &host);
    unsetenv("ZINFER_GPU_SAMPLER");
    print_message("tokens sampled on the device: %llu (device run), %llu (host run)\n",
                  (unsigned long long)dev.device_sampled, (unsigned long long)host.device_sampled);
    int total = 0;
    for (int i = 0; i < N_CASES; i++) total += dev.n[i];
    assert_int_equal(dev.device_sampled, (uint64_t)total); /* every token, on the device */
    assert_int_equal(host.device_sampled, 0);
    int bad = 0;
    for (int i = 0; i < N_CASES; i++) bad += compare(i, &dev, "device", &host, "host") != 0.0;
    assert_int_equal(bad, 0);
    /* the EOS mask held: no masked id among the mintok tokens */
    for (int j = 0; j < dev.n[MINTOK]; j++)
        assert_true(dev.tok[MINTOK][j] != F.mintok_eos[0] && dev.tok[MINTOK][j] != F.mintok_eos[1]);
    assert_int_equal(dev.n[MINTOK], GEN);
}

static void test_cpu_vs_cuda(void **state) {
    (void)state;
    choose_mintok_eos();
    run_out cpu, gpu;
    run(F.m_cpu, F.jv, ALL, 0, &cpu);
    run(F.m_gpu, F.jv, ALL, 0, &gpu);
    assert_int_equal(cpu.device_sampled, 0);
    assert_true(gpu.device_sampled > 0);
    int bad = 0;
    for (int i = 0; i < N_CASES; i++) {
        double gap = compare(i, &cpu, "CPU", &gpu, "CUDA");
        int greedy = i != SEEDED && i != SEEDED2;
        if (greedy && gap >= 0.05) bad++; /* not a near-tie */
    }
    assert_int_equal(bad, 0);
}

static void test_logprobs_take_host_path(void **state) {
    (void)state;
    const unsigned mask = (1u << PLAIN) | (1u << PEN);
    run_out lp, plain;
    run(F.m_gpu, F.jv, mask, 1, &lp);
    run(F.m_gpu, F.jv, mask, 0, &plain);
    assert_int_equal(lp.device_sampled, 0);
    assert_true(plain.device_sampled > 0);
    assert_true(compare(PLAIN, &lp, "logprobs", &plain, "plain") == 0.0);
    assert_true(compare(PEN, &lp, "logprobs", &plain, "plain") == 0.0);
}

static int setup(void **state) {
    (void)state;
    zi_error err = {0};
    char path[4096];
    zi_default_model_path(path, sizeof path);
    zi_cpu_options co = {.n_threads = 0};
    zi_cuda_options o = {.device = 0};
    if (zi_cpu_backend_create(&co, &F.cpu, &err) || zi_cuda_backend_create(&o, &F.gpu, &err) ||
        zi_model_load(path, F.cpu, &F.m_cpu, &err) || zi_model_load(path, F.gpu, &F.m_gpu, &err) ||
        zi_tokenizer_load(zi_model_gguf(F.m_cpu), &F.tok, &err) ||
        zi_json_vocab_create(F.tok, &F.jv, &err) || zi_json_vocab_create(F.tok, &F.jv, &err)) {
        fprintf(stderr, "setup (%s): %s\n", path, err.msg);
        return -1;
    }
    for (int i = 0; i < N_CASES; i++)
        if (zi_tokenizer_encode(F.tok, texts[i], strlen(texts[i]), 1, 1, &F.ids[i], &F.n_ids[i],
                                &err)) {
            fprintf(stderr, "encode: %s\n", err.msg);
            return -1;
        }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++) free(F.ids[i]);
    zi_json_vocab_free(F.jv);
    zi_tokenizer_free(F.tok);
    zi_model_free(F.m_cpu);
    zi_model_free(F.m_gpu);
    zi_backend_free(F.gpu);
    zi_backend_free(F.cpu);
    return 0;
}

int main(void) {
    int n = 0;
    zi_error err = {0};
    if (!zi_device_sampler_compiled()) {
        printf("SKIP: built without the GPU sampler\n");
        return 77;
    }
    if (zi_cuda_device_count(&n, &err) != ZI_OK || n < 1) {
        printf("SKIP: no usable CUDA device: %s\n", err.msg);
        return 77; /* meson's and scripts/run_tests.py's "skipped" */
    }
    char path[4096];
    zi_default_model_path(path, sizeof path);
    if (access(path, R_OK) != 0) {
        printf("SKIP: no model at %s\n", path);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_vs_host_sampling),
        cmocka_unit_test(test_cpu_vs_cuda),
        cmocka_unit_test(test_logprobs_take_host_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
