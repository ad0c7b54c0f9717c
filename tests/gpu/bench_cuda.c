/*
 * bench_cuda.c - decode and prefill speed of the model on a device, through
 * the engine's own zi_model_forward / zi_model_forward_async.
 *
 *   bench_cuda [--device cuda:0] [--model PATH] [--prompt-tokens 512]
 *              [--gen-tokens 128] [--streams 64] [--stream-prompt 64]
 *              [--f16-weights auto|on|off]   (zi_cuda_options.f16_weights)
 *
 * Measures, after a warm-up pass:
 *   prefill   one sequence of --prompt-tokens tokens in one forward pass
 *   decode_b1 --gen-tokens greedy steps of that sequence, one token per pass
 *   decode_bS --streams sequences (each prefilled with --stream-prompt
 *             tokens) decoding together, one pass of S tokens per step;
 *             aggregate tokens per second
 * Decode is timed three ways on a GPU: "host" (the logits copied to the
 * host and the argmax taken there), "device" (the logits stay on the GPU;
 * the GPU sampler picks the token and only the ids come back) and "graph"
 * (the device way with each step's pass replayed from a CUDA graph). With
 * a GPU it also measures the floor a decode step cannot beat: the bytes of
 * the weights over the device's copy bandwidth (a 1 GiB device-to-device
 * copy, bytes read plus written) plus the graph's nodes times the cost of
 * one node (the larger of a graph of 1,000 empty kernels' and of 1,000
 * four-byte copies', per node). It prints one JSON line last:
 *   {"device", "backend", "prefill_tok_s", "decode_b1_tok_s",
 *    "decode_batch", "decode_batch_tok_s", ... "floor_b1_us", ...}
 * where decode_b1_tok_s / decode_batch_tok_s are the best way's.
 * Works with --device cpu too (the host way only).
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

#ifdef ZI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_backend.h"
#include "cuda_kernels.h"
#include "sampling.h"
#endif

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

static const char *WAYS[3] = {"host", "device", "graph"};

typedef struct way_result {
    double tok_s;
    uint64_t checksum; /* of the tokens generated: the ways must agree */
    size_t nodes;      /* graph nodes (the graph way) */
} way_result;

/* One decode run: S sequences at positions start.. of kv, G steps. */
typedef struct bench_ctx {
    zi_model *m;
    zi_backend *be;
    zi_kv_fixed *kv;
    int V, S, G;
    int32_t start;
    float *logits; /* host, S rows */
    int32_t tok[1024], pos[1024], seq[1024];
    uint8_t want[1024];
    zi_batch batch;
} bench_ctx;

static void step_batch(bench_ctx *c, int g) {
    for (int s = 0; s < c->S; s++) c->pos[s] = c->start + g, c->seq[s] = s, c->want[s] = 1;
    c->batch = (zi_batch){
        .n_tokens = c->S, .tokens = c->tok, .pos = c->pos, .seq = c->seq, .want_logits = c->want};
    zi_kv_fixed_use(c->kv, &c->batch);
}

#ifdef ZI_HAVE_CUDA
static int enqueue_pass(void *arg, zi_error *err) {
    bench_ctx *c = arg;
    return zi_model_forward_async(c->m, c->kv->kv, &c->batch, NULL, NULL, err);
}

/* Copy bandwidth (bytes read + written per second) and the cost of one
 * node of a replayed graph (1,000 four-byte copies). */
static int measure_device(double *bw, double *node_us, double *kernel_us, zi_error *err) {
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b2 = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    float ms = 0, best = 1e30f;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (!e) e = cudaMalloc(&b2, bytes);
    if (!e) e = cudaMemset(a, 1, bytes);
    if (!e) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (!e) e = cudaEventCreate(&e0);
    if (!e) e = cudaEventCreate(&e1);
    for (int r = 0; r < 6 && !e; r++) {
        e = cudaEventRecord(e0, st);
        if (!e) e = cudaMemcpyAsync(b2, a, bytes, cudaMemcpyDeviceToDevice, st);
        if (!e) e = cudaEventRecord(e1, st);
        if (!e) e = cudaEventSynchronize(e1);
        if (!e) e = cudaEventElapsedTime(&ms, e0, e1);
        if (!e && r > 0 && ms < best) best = ms; /* r 0 warms up */
    }
    if (!e) *bw = 2.0 * (double)bytes / (best * 1e-3);
    if (!e) e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < 1000 && !e; i++)
        e = cudaMemcpyAsync((char *)b2 + 4 * (i % 64), (char *)a + 4 * (i % 64), 4,
                            cudaMemcpyDeviceToDevice, st);
    if (!e) e = cudaStreamEndCapture(st, &graph);
    if (!e) e = cudaGraphInstantiate(&exec, graph, 0);
    best = 1e30f;
    for (int r = 0; r < 6 && !e; r++) {
        e = cudaEventRecord(e0, st);
        if (!e) e = cudaGraphLaunch(exec, st);
        if (!e) e = cudaEventRecord(e1, st);
        if (!e) e = cudaEventSynchronize(e1);
        if (!e) e = cudaEventElapsedTime(&ms, e0, e1);
        if (!e && r > 0 && ms < best) best = ms;
    }
    if (!e) *node_us = best * 1e3 / 1000.0;
    /* the same with 1,000 empty kernels: a kernel node's cost */
    if (exec) cudaGraphExecDestroy(exec), exec = NULL;
    if (graph) cudaGraphDestroy(graph), graph = NULL;
    if (!e) e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < 1000 && !e; i++) e = zi_cuda_noop(st);
    if (!e) e = cudaStreamEndCapture(st, &graph);
    if (!e) e = cudaGraphInstantiate(&exec, graph, 0);
    best = 1e30f;
    for (int r = 0; r < 6 && !e; r++) {
        e = cudaEventRecord(e0, st);
        if (!e) e = cudaGraphLaunch(exec, st);
        if (!e) e = cudaEventRecord(e1, st);
        if (!e) e = cudaEventSynchronize(e1);
        if (!e) e = cudaEventElapsedTime(&ms, e0, e1);
        if (!e && r > 0 && ms < best) best = ms;
    }
    if (!e) *kernel_us = best * 1e3 / 1000.0;
    int rc = e ? zi_error_set(err, ZI_EIO, "%s", cudaGetErrorString(e)) : ZI_OK;
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (st) cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b2);
    (void)cudaGetLastError();
    return rc;
}
#endif

/* G greedy steps of c's S sequences, the way w (0 host, 1 device, 2 graph). */
static int decode(bench_ctx *c, int w, way_result *r, zi_error *err) {
    int rc = ZI_OK;
    double t = 0;
    uint64_t sum = 1469598103934665603ull;
#ifdef ZI_HAVE_CUDA
    zi_cuda_sampler *smp = NULL;
    zi_cuda_graph *graph = NULL;
    zi_sampling_params greedy;
    zi_sampling_params_init(&greedy);
    greedy.temperature = 0;
    zi_cuda_sample_row rows[1024];
    for (int s = 0; s < c->S; s++) rows[s] = (zi_cuda_sample_row){.params = &greedy};
    if (w > 0) rc = zi_cuda_sampler_create(c->be, c->V, c->S, &smp, err);
    zi_attn_shape shape = {.block_size = ZI_KV_FIXED_BLOCK, .max_ctx = zi_kv_cache_ctx(c->kv->kv)};
#else
    if (w > 0) return zi_error_set(err, ZI_EUNSUPPORTED, "built without CUDA");
#endif
    for (int g = 0; g < c->G && !rc; g++) {
        step_batch(c, g);
        double t0 = now_s();
        if (w == 0) {
            rc = zi_model_forward(c->m, c->kv->kv, &c->batch, c->logits, err);
            for (int s = 0; s < c->S && !rc; s++)
                c->tok[s] = argmax(c->logits + (size_t)s * c->V, c->V);
        }
#ifdef ZI_HAVE_CUDA
        else {
            const float *d_logits = NULL;
            if (w == 2 && !graph) {
                /* capture after a pass of this shape has run: the first step runs eagerly */
                if (g > 0) rc = zi_cuda_graph_capture(c->be, enqueue_pass, c, &graph, err);
                if (!rc && graph) r->nodes = zi_cuda_graph_nodes(graph);
                if (!rc && graph) rc = c->be->ops->sync(c->be, err); /* capture ran nothing */
                t0 = now_s();
            }
            if (!rc && w == 2 && graph) {
                zi_batch_view v = {c->S, c->pos, c->seq, c->batch.block_tables,
                                   c->batch.table_stride, NULL};
                rc = zi_cuda_graph_launch(graph, c->tok, &v, &shape, err);
                d_logits = zi_model_device_logits(c->m);
            } else if (!rc) {
                int n_rows = 0;
                rc = zi_model_forward_async(c->m, c->kv->kv, &c->batch, &d_logits, &n_rows, err);
            }
            if (!rc)
                rc = zi_cuda_sampler_sample_async(smp, d_logits, (size_t)c->V, rows, c->S, err);
            const int32_t *tok = NULL;
            if (!rc) rc = zi_cuda_sampler_wait(smp, &tok, err);
            if (!rc) rc = c->be->ops->sync(c->be, err);
            if (!rc) memcpy(c->tok, tok, sizeof(int32_t) * (size_t)c->S);
        }
#endif
        if (g > 0 || w == 0) t += now_s() - t0; /* the graph way's first step is its warm-up */
        for (int s = 0; s < c->S; s++)
            sum = (sum ^ (uint64_t)(uint32_t)c->tok[s]) * 1099511628211ull;
    }
    int timed = w == 0 ? c->G : c->G - 1;
    r->tok_s = t > 0 ? (double)c->S * timed / t : 0;
    r->checksum = sum;
#ifdef ZI_HAVE_CUDA
    zi_cuda_graph_free(graph);
    zi_cuda_sampler_free(smp);
    zi_sampling_params_free(&greedy);
#endif
    return rc;
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    char model[4096];
    zi_default_model_path(model, sizeof model);
    long long P = 512, G = 128, S = 64, SP = 64;
    int f16 = 0; /* zi_cuda_options.f16_weights */
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long iv;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: bench_cuda [--device D] [--model PATH] [--prompt-tokens P] "
                   "[--gen-tokens G] [--streams S] [--stream-prompt N] [--f16-weights auto|on|off]\n");
            return 0;
        } else if (!strcmp(a, "--device") && v) {
            device = v;
        } else if (!strcmp(a, "--f16-weights") && v) {
            f16 = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? -1 : 0;
            if (f16 == 0 && strcmp(v, "auto")) {
                fprintf(stderr, "bench_cuda: --f16-weights takes auto, on or off\n");
                return 2;
            }
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
#ifdef ZI_HAVE_CUDA
    zi_device_spec spec;
    if (f16 && zi_device_parse(device, &spec, &err) == ZI_OK && spec.kind != ZI_DEVICE_CPU) {
        zi_cuda_options o = {.device = spec.index, .f16_weights = f16};
        if (zi_cuda_backend_create(&o, &be, &err)) return die("backend", &err);
    } else
#endif
        if (zi_backend_create_for_device(device, 0, 0, &be, &err))
        return die("backend", &err);
    if (zi_model_load(model, be, &m, &err)) return die("model", &err);
    int V = zi_model_get_config(m)->n_vocab;
    int ctx = (int)(P + G + 8), sctx = (int)(SP + G + 8);
    int rows = S > 1 ? (int)S : 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P > S * SP ? P : S * SP));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(P > S * SP ? P : S * SP));
    int32_t *seq = calloc((size_t)(P > S * SP ? P : S * SP), sizeof(int32_t));
    uint8_t *want = malloc((size_t)rows);
    float *logits = malloc(sizeof(float) * (size_t)V * rows);
    if (!ids || !pos || !seq || !want || !logits) {
        zi_error_set(&err, ZI_ENOMEM, "out of memory");
        return die("buffers", &err);
    }
    for (long long i = 0; i < (P > S * SP ? P : S * SP); i++)
        ids[i] = (int32_t)(zi_sampler_uniform(12345, (uint64_t)i) * (double)V);

    /* one sequence: warm-up, prefill */
    zi_kv_fixed kv;
    if (zi_kv_fixed_create(m, 1, ctx, &kv, &err)) return die("KV cache", &err);
    for (int i = 0; i < P; i++) pos[i] = i, seq[i] = 0;
    zi_batch b = {.n_tokens = (int)P, .tokens = ids, .pos = pos, .seq = seq};
    zi_kv_fixed_use(&kv, &b);
    if (zi_model_forward(m, kv.kv, &b, logits, &err)) return die("warm-up", &err);
    double t0 = now_s();
    if (zi_model_forward(m, kv.kv, &b, logits, &err)) return die("prefill", &err);
    double t_prefill = now_s() - t0;
    int32_t first = argmax(logits, V);
    zi_kv_fixed_free(&kv);

    bench_ctx bc = {.m = m, .be = be, .V = V, .logits = logits, .G = (int)G};
    int gpu = !strcmp(be->ops->name, "cuda");
    int n_ways = gpu ? 3 : 1;
    way_result r1[3] = {{0}}, rS[3] = {{0}};
    for (int w = 0; w < n_ways; w++) {
        /* batch 1: the prefilled sequence (its cache rebuilt per way) */
        if (zi_kv_fixed_create(m, 1, ctx, &kv, &err)) return die("KV cache", &err);
        for (int i = 0; i < P; i++) pos[i] = i, seq[i] = 0;
        zi_kv_fixed_use(&kv, &b);
        if (zi_model_forward(m, kv.kv, &b, logits, &err)) return die("prefill", &err);
        bc.kv = &kv;
        bc.S = 1;
        bc.start = (int32_t)P;
        bc.tok[0] = first;
        if (decode(&bc, w, &r1[w], &err)) return die(WAYS[w], &err);
        zi_kv_fixed_free(&kv);

        /* S sequences decoding together */
        if (zi_kv_fixed_create(m, (int)S, sctx, &kv, &err)) return die("KV cache (streams)", &err);
        for (int s = 0; s < S; s++) {
            for (int i = 0; i < SP; i++) pos[i] = i, seq[i] = s;
            zi_batch pb = {
                .n_tokens = (int)SP, .tokens = ids + (size_t)s * SP, .pos = pos, .seq = seq};
            zi_kv_fixed_use(&kv, &pb);
            if (zi_model_forward(m, kv.kv, &pb, logits, &err)) return die("stream prefill", &err);
            bc.tok[s] = argmax(logits, V);
        }
        bc.kv = &kv;
        bc.S = (int)S;
        bc.start = (int32_t)SP;
        if (decode(&bc, w, &rS[w], &err)) return die(WAYS[w], &err);
        zi_kv_fixed_free(&kv);
    }
    if (be->ops->sync(be, &err)) return die("device", &err);
    /* every way must have produced the same tokens (greedy, same inputs) */
    for (int w = 1; w < n_ways; w++)
        if (r1[w].checksum != r1[0].checksum || rS[w].checksum != rS[0].checksum)
            fprintf(stderr,
                    "bench_cuda: note: the %s way's tokens differ from the host way's "
                    "(checksums %llx/%llx vs %llx/%llx)\n",
                    WAYS[w], (unsigned long long)r1[w].checksum, (unsigned long long)rS[w].checksum,
                    (unsigned long long)r1[0].checksum, (unsigned long long)rS[0].checksum);
    int best1 = 0, bestS = 0;
    for (int w = 1; w < n_ways; w++) {
        if (r1[w].tok_s > r1[best1].tok_s) best1 = w;
        if (rS[w].tok_s > rS[bestS].tok_s) bestS = w;
    }
    printf("{\"device\": \"%s\", \"backend\": \"%s\", \"prompt_tokens\": %lld, "
           "\"prefill_tok_s\": %.1f, \"gen_tokens\": %lld, \"decode_b1_tok_s\": %.1f, "
           "\"decode_batch\": %lld, \"decode_batch_tok_s\": %.1f, \"weight_bytes\": %llu",
           device, be->ops->name, P, (double)P / t_prefill, G, r1[best1].tok_s, S, rS[bestS].tok_s,
           (unsigned long long)zi_model_weight_bytes(m));
    for (int w = 0; w < n_ways; w++)
        printf(", \"b1_%s_tok_s\": %.1f, \"bS_%s_tok_s\": %.1f", WAYS[w], r1[w].tok_s, WAYS[w],
               rS[w].tok_s);
#ifdef ZI_HAVE_CUDA
    if (gpu) {
        double bw = 0, node_us = 0, kernel_us = 0;
        if (measure_device(&bw, &node_us, &kernel_us, &err))
            return die("device measurements", &err);
        /* the floor: the weights read once at the copy bandwidth, plus one
         * kernel node's cost per node (the larger of the two node costs) */
        double wb = (double)zi_model_weight_bytes(m), nc = kernel_us > node_us ? kernel_us : node_us;
        double f1 = wb / bw * 1e6 + (double)r1[2].nodes * nc;
        double fS = wb / bw * 1e6 + (double)rS[2].nodes * nc;
        printf(", \"copy_node_us\": %.3f, \"f16_weight_bytes\": %zu", node_us,
               zi_cuda_backend_f16_bytes(be));
        printf(", \"copy_gb_s\": %.1f, \"graph_node_us\": %.3f, \"graph_nodes_b1\": %zu, "
               "\"graph_nodes_bS\": %zu, \"floor_b1_us\": %.1f, \"floor_bS_us\": %.1f, "
               "\"step_b1_us\": %.1f, \"step_bS_us\": %.1f, \"b1_over_floor\": %.2f, "
               "\"bS_over_floor\": %.2f",
               bw / 1e9, nc, r1[2].nodes, rS[2].nodes, f1, fS, 1e6 / r1[2].tok_s,
               1e6 * (double)S / rS[2].tok_s, 1e6 / r1[2].tok_s / f1,
               1e6 * (double)S / rS[2].tok_s / fS);
    }
#endif
    printf("}\n");
    zi_model_free(m);
    zi_backend_free(be);
    free(ids);
    free(pos);
    free(seq);
    free(want);
    free(logits);
    return 0;
}
