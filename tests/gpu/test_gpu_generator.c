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
 *   - decode passes replayed from CUDA graphs vs the same run op by op
 *     (ZINFER_CUDA_GRAPHS=0): every token equal, graphs captured and
 *     replayed;
 *   - a context asking for log probabilities takes the host path (no token
 *     is counted as sampled on the device) and gets the same tokens;
 *   - without the model: the GPU sampler's full entry point (penalties, EOS
 *     ids, bitmasks, per-row logits pointers into a padded buffer) against
 *     its C reference (sampling_ref.h) on random rows, and a row with
 *     nothing eligible.
 *
 * ZINFER_GPU_TEST_QUICK=1 runs only the model-free test (for
 * compute-sanitizer). Without the model the model tests are skipped.
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
#include "vocab_trie.h"
#include "kv_fixed.h"
#include "model.h"
#include "sampling.h"
#include "sampling_ref.h"
#include "test_rand.h"
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
    zi_grammar_vocab *jv; /* NULL when the tokenizer's size is not the model's */
    int32_t *ids[N_CASES];
    size_t n_ids[N_CASES];
    int32_t mintok_eos[2]; /* set from the plain run */
} F;

static int quick(void) {
    const char *q = getenv("ZINFER_GPU_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

typedef struct run_out {
    int32_t tok[N_CASES][GEN];
    int n[N_CASES];
    uint64_t device_sampled;
    uint64_t graph_captures, graph_replays;
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
static void run(zi_model *m, const zi_grammar_vocab *jv, unsigned mask, int logprobs,
                run_out *out) {
    zi_error err = {0};
    zi_generator *g = NULL;
    zi_generator_config cfg = {.n_slots = N_CASES,
                               .ctx = 512,
                               .max_batch_tokens = 7,
                               .sample_vocab = zi_tokenizer_vocab_size(F.tok)};
    if (cfg.sample_vocab > zi_model_get_config(m)->n_vocab) cfg.sample_vocab = 0;
    if (zi_generator_create(m, &cfg, &g, &err)) fail_msg("generator: %s", err.msg);
    if (jv) assert_int_equal(zi_generator_set_grammar_vocab(g, jv, &err), ZI_OK);
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
    out->graph_captures = st.graph_captures;
    out->graph_replays = st.graph_replays;
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

/* Every case on the GPU model as it runs by default (on), then with the
 * environment variable `off` set to 0 (off). */
static void run_on_off(const char *off_var, run_out *on, run_out *off) {
    run(F.m_gpu, F.jv, ALL, 0, on);
    setenv(off_var, "0", 1);
    run(F.m_gpu, F.jv, ALL, 0, off);
    unsetenv(off_var);
}

static void test_device_vs_host_sampling(void **state) {
    (void)state;
    if (!F.m_gpu) skip();
    choose_mintok_eos();
    run_out dev, host;
    run_on_off("ZINFER_GPU_SAMPLER", &dev, &host);
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

/* Decode passes replayed from CUDA graphs give the tokens the same passes
 * give op by op, and graphs were used. The kernels are the same, but a
 * graph keeps the attention's split across blocks chosen at its capture
 * (cuda_backend.h), so sums may be ordered differently: greedy sequences
 * must be equal or part at a near-tie, as CPU and CUDA do. */
static void test_graphs_vs_op_by_op(void **state) {
    (void)state;
    if (!F.m_gpu) skip();
    choose_mintok_eos();
    run_out gr, ops;
    run_on_off("ZINFER_CUDA_GRAPHS", &gr, &ops);
    print_message("CUDA graphs: %llu captured, %llu passes replayed (op by op run: %llu)\n",
                  (unsigned long long)gr.graph_captures, (unsigned long long)gr.graph_replays,
                  (unsigned long long)ops.graph_replays);
    assert_true(gr.graph_captures > 0);
    assert_true(gr.graph_replays > gr.graph_captures);
    assert_int_equal(ops.graph_replays, 0);
    int bad = 0;
    for (int i = 0; i < N_CASES; i++) {
        double gap = compare(i, &gr, "graphs", &ops, "op-by-op");
        if (i != SEEDED && i != SEEDED2 && gap >= 0.05) bad++; /* not a near-tie */
    }
    assert_int_equal(bad, 0);
}

static void test_cpu_vs_cuda(void **state) {
    (void)state;
    if (!F.m_gpu) skip();
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
    if (!F.m_gpu) skip();
    const unsigned mask = (1u << PLAIN) | (1u << PEN);
    run_out lp, plain;
    run(F.m_gpu, F.jv, mask, 1, &lp);
    run(F.m_gpu, F.jv, mask, 0, &plain);
    assert_int_equal(lp.device_sampled, 0);
    assert_true(plain.device_sampled > 0);
    assert_true(compare(PLAIN, &lp, "logprobs", &plain, "plain") == 0.0);
    assert_true(compare(PEN, &lp, "logprobs", &plain, "plain") == 0.0);
}

/* The full entry point against the C reference: 64 rows in one call, each
 * with its own history (narrow id ranges, so that the top tokens are
 * penalised), EOS ids and, for some, a bitmask, read through per-row
 * pointers in shuffled order from a buffer padded beyond n_vocab. */
static void test_full_rows_vs_reference(void **state) {
    (void)state;
    enum { V = 5001, LD = 5120, ROWS = 64, HIST = 200, W = (V + 31) / 32 };
    static zi_test_rng rng = {0x5eed5eedull};
    zi_error err = {0};
    float *lg = malloc(sizeof(float) * (size_t)LD * ROWS), *b = malloc(sizeof(float) * V);
    int32_t *hist = malloc(sizeof(int32_t) * HIST * ROWS),
            *forbid = malloc(sizeof(int32_t) * 4 * ROWS);
    int32_t *mask = malloc(sizeof(int32_t) * W * ROWS);
    zi_gpu_pen *ents = malloc(sizeof(zi_gpu_pen) * (HIST + 4));
    zi_sampling_params sp[ROWS];
    zi_cuda_sample_row_full rows[ROWS];
    int src[ROWS];
    for (size_t i = 0; i < (size_t)LD * ROWS; i++) lg[i] = zi_test_frand(&rng, -6.0f, 6.0f);
    for (int r = 0; r < ROWS; r++) src[r] = (r * 37 + 11) % ROWS; /* a permutation */
    float *d = F.gpu->ops->alloc(F.gpu, sizeof(float) * (size_t)LD * ROWS);
    assert_non_null(d);
    F.gpu->ops->upload(F.gpu, d, lg, sizeof(float) * (size_t)LD * ROWS);
    zi_cuda_sampler *s = NULL;
    assert_int_equal(zi_cuda_sampler_create(F.gpu, V, ROWS, &s, &err), ZI_OK);
    zi_gpu_pen_scratch sc;
    assert_int_equal(zi_gpu_pen_scratch_init(&sc, V, &err), ZI_OK);
    int diff_greedy = 0, diff_seeded = 0, n_greedy = 0;
    for (int round = 0; round < 4; round++) {
        for (int r = 0; r < ROWS; r++) {
            const float *row = lg + (size_t)src[r] * LD;
            int32_t top = 0; /* the row's argmax: penalised in most rows */
            for (int t = 1; t < V; t++)
                if (row[t] > row[top]) top = t;
            zi_sampling_params_init(&sp[r]);
            sp[r].repetition_penalty = r % 4 == 0 ? 1.0 : 1.5;
            sp[r].frequency_penalty = r % 3 == 0 ? 0.0 : 0.8;
            sp[r].presence_penalty = r % 5 == 0 ? 0.0 : 0.5;
            sp[r].temperature = r % 2 ? 0.0 : 0.9;
            sp[r].top_k = round == 3 ? 50 : 0;
            sp[r].top_p = round == 2 ? 0.9 : 1.0;
            sp[r].min_p = round == 1 ? 0.05 : 0.0;
            sp[r].seed = 77 + (uint64_t)r;
            int32_t *h = hist + (size_t)r * HIST, *fb = forbid + 4 * r;
            size_t np = 20 + (size_t)(zi_test_urand(&rng) * 80),
                   ng = (size_t)(zi_test_urand(&rng) * 100);
            for (size_t i = 0; i < np + ng; i++)
                h[i] = i % 3 == 0 ? top : (int32_t)(zi_test_urand(&rng) * (r % 2 ? 64 : V));
            size_t nf = (size_t)(r % 3);
            for (size_t i = 0; i < nf; i++) fb[i] = (int32_t)(zi_test_urand(&rng) * V);
            int32_t *m = mask + (size_t)r * W;
            for (int w = 0; w < W; w++)
                m[w] = (int32_t)(uint32_t)(zi_test_urand(&rng) * 4294967296.0);
            rows[r] = (zi_cuda_sample_row_full){.params = &sp[r],
                                                .step = (uint64_t)(round * 1000 + r),
                                                .logits = d + (size_t)src[r] * LD,
                                                .prompt_ids = h,
                                                .n_prompt = np,
                                                .generated_ids = h + np,
                                                .n_generated = ng,
                                                .bitmask = r % 4 == 1 ? m : NULL,
                                                .eos_forbid = fb,
                                                .n_eos_forbid = nf};
        }
        assert_int_equal(zi_cuda_sampler_sample_full_async(s, d, LD, rows, ROWS, &err), ZI_OK);
        const int32_t *tok;
        if (zi_cuda_sampler_wait(s, &tok, &err)) fail_msg("wait: %s", err.msg);
        for (int r = 0; r < ROWS; r++) {
            zi_gpu_sample_params g;
            uint32_t n_ent = 0;
            assert_int_equal(zi_gpu_sample_params_set(&g, &sp[r], rows[r].step, &err), ZI_OK);
            assert_int_equal(zi_gpu_pen_build(&sc, &g, rows[r].prompt_ids, rows[r].n_prompt,
                                              rows[r].generated_ids, rows[r].n_generated,
                                              rows[r].eos_forbid, rows[r].n_eos_forbid, ents,
                                              &n_ent, &err),
                             ZI_OK);
            zi_gpu_prepare_ref(lg + (size_t)src[r] * LD, V, &g, ents, n_ent,
                               (const uint32_t *)rows[r].bitmask, b);
            int32_t want = zi_gpu_sample_ref(b, V, &g);
            if (!(sp[r].temperature > 0.0)) {
                n_greedy++;
                if (tok[r] != want) {
                    diff_greedy++;
                    print_message("round %d row %d greedy: GPU %d, reference %d\n", round, r,
                                  tok[r], want);
                }
            } else {
                diff_seeded += tok[r] != want;
            }
            zi_sampling_params_free(&sp[r]);
        }
    }
    print_message("%d greedy rows, %d differ; %d seeded rows, %d differ\n", n_greedy, diff_greedy,
                  4 * ROWS - n_greedy, diff_seeded);
    assert_int_equal(diff_greedy, 0);
    assert_true(diff_seeded <= 2); /* expf's last bits may move a boundary */

    /* a row whose bitmask allows only its forbidden ids: -1, ZI_ERANGE,
     * the other row still sampled */
    zi_sampling_params g0;
    zi_sampling_params_init(&g0);
    memset(mask, 0, sizeof(int32_t) * W);
    mask[0] = 1 << 3;
    const int32_t f3 = 3;
    zi_cuda_sample_row_full two[2] = {
        {.params = &g0, .logits = d, .bitmask = mask, .eos_forbid = &f3, .n_eos_forbid = 1},
        {.params = &g0, .logits = d + LD, .bitmask = mask}};
    assert_int_equal(zi_cuda_sampler_sample_full_async(s, d, LD, two, 2, &err), ZI_OK);
    const int32_t *tok;
    assert_int_equal(zi_cuda_sampler_wait(s, &tok, &err), ZI_ERANGE);
    assert_int_equal(tok[0], -1);
    assert_int_equal(tok[1], 3);
    /* ids outside the vocabulary are refused before anything is queued */
    const int32_t bad = V;
    two[1].eos_forbid = &bad, two[1].n_eos_forbid = 1;
    assert_int_equal(zi_cuda_sampler_sample_full_async(s, d, LD, two, 2, &err), ZI_EINVAL);
    zi_sampling_params_free(&g0);
    zi_gpu_pen_scratch_free(&sc);
    zi_cuda_sampler_free(s);
    F.gpu->ops->free(F.gpu, d);
    if (zi_cuda_backend_status(F.gpu, &err)) fail_msg("CUDA backend: %s", err.msg);
    free(lg);
    free(b);
    free(hist);
    free(forbid);
    free(mask);
    free(ents);
}

static int setup(void **state) {
    (void)state;
    zi_error err = {0};
    char path[4096];
    zi_default_model_path(path, sizeof path);
    zi_cpu_options co = {.n_threads = 0};
    zi_cuda_options o = {.device = 0};
    if (zi_cuda_backend_create(&o, &F.gpu, &err)) {
        fprintf(stderr, "CUDA backend: %s\n", err.msg);
        return -1;
    }
    if (quick() || access(path, R_OK) != 0) {
        printf("%s: the model tests are skipped\n", quick() ? "quick mode" : "no model");
        return 0;
    }
    if (zi_cpu_backend_create(&co, &F.cpu, &err) || zi_model_load(path, F.cpu, &F.m_cpu, &err) ||
        zi_model_load(path, F.gpu, &F.m_gpu, &err) ||
        zi_tokenizer_load(zi_model_gguf(F.m_cpu), &F.tok, &err) ||
        zi_grammar_vocab_create(zi_tokenizer_vocab_size(F.tok), zi_tokenizer_constraint_bytes,
                                F.tok, &F.jv, &err)) {
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
    zi_grammar_vocab_free(F.jv);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_rows_vs_reference),
        cmocka_unit_test(test_device_vs_host_sampling),
        cmocka_unit_test(test_graphs_vs_op_by_op),
        cmocka_unit_test(test_cpu_vs_cuda),
        cmocka_unit_test(test_logprobs_take_host_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
