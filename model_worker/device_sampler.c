/*
 * device_sampler.c - see device_sampler.h. With CUDA: a zi_cuda_sampler on
 * the model's backend and a table of zi_cuda_sample_row_full rows filled
 * from the generator's zi_sampler_row rows. A build without CUDA has no
 * device to sample on: zi_device_sampler_create hands back no bridge and
 * every step samples on the host (the complete behaviour there).
 */
#include "device_sampler.h"

#include <stdlib.h>
#include <string.h>

#ifdef ZI_HAVE_CUDA

#include "cuda_backend.h"
#include "sampling.h"

struct zi_device_sampler {
    zi_model *model;
    zi_backend *be;
    zi_cuda_sampler *cs;
    zi_cuda_sample_row_full *rows; /* [max_rows] */
    int max_rows;
    const float *logits; /* the last pass's rows (device) */
    int n_logit_rows;
    size_t ld; /* floats per logits row: the model's n_vocab */
    uint64_t count;
};

int zi_device_sampler_compiled(void) {
    return 1;
}

int zi_device_sampler_create(zi_model *m, int32_t n_vocab, int max_rows, zi_device_sampler **out,
                             zi_error *err) {
    *out = NULL;
    zi_backend *be = zi_model_backend(m);
    if (!be || !be->ops || strcmp(be->ops->name, "cuda") != 0 || !zi_cuda_backend_stream(be))
        return ZI_OK;
    const char *env = getenv("ZINFER_GPU_SAMPLER");
    if (env && strcmp(env, "0") == 0) return ZI_OK;
    if (max_rows > 65535) max_rows = 65535; /* the generator then samples more on the host */
    zi_device_sampler *d = calloc(1, sizeof *d);
    if (!d) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    d->model = m;
    d->be = be;
    d->max_rows = max_rows;
    d->ld = (size_t)zi_model_get_config(m)->n_vocab;
    d->rows = calloc((size_t)max_rows, sizeof *d->rows);
    int rc = d->rows ? zi_cuda_sampler_create(be, n_vocab, max_rows, &d->cs, err)
                     : zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (rc) {
        zi_device_sampler_free(d);
        return rc;
    }
    *out = d;
    return ZI_OK;
}

void zi_device_sampler_free(zi_device_sampler *d) {
    if (!d) return;
    zi_cuda_sampler_free(d->cs);
    free(d->rows);
    free(d);
}

int zi_device_sampler_forward(zi_device_sampler *d, zi_kv_cache *kv, const zi_batch *b,
                              zi_error *err) {
    d->logits = NULL;
    d->n_logit_rows = 0;
    return zi_model_forward_async(d->model, kv, b, &d->logits, &d->n_logit_rows, err);
}

int zi_device_sampler_sample(zi_device_sampler *d, const zi_sampler_row *rows, const int *src_row,
                             int n_rows, int32_t *out, zi_error *err) {
    if (n_rows < 1) return ZI_OK;
    if (n_rows > d->max_rows || !d->logits)
        return zi_error_set(err, ZI_EINVAL, "GPU sampling: %d rows (at most %d) or no pass", n_rows,
                            d->max_rows);
    for (int k = 0; k < n_rows; k++) {
        if (src_row[k] < 0 || src_row[k] >= d->n_logit_rows)
            return zi_error_set(err, ZI_EINVAL, "GPU sampling: logits row %d of %d", src_row[k],
                                d->n_logit_rows);
        const zi_sampler_row *r = &rows[k];
        if (r->n_more_generated) /* speculation's rows sample on the host */
            return zi_error_set(err, ZI_EINVAL, "GPU sampling: row %d has more_generated_ids", k);
        d->rows[k] = (zi_cuda_sample_row_full){
            .params = r->params,
            .step = r->step,
            .logits = d->logits + (size_t)src_row[k] * d->ld,
            .prompt_ids = r->prompt_ids,
            .n_prompt = r->n_prompt,
            .generated_ids = r->generated_ids,
            .n_generated = r->n_generated,
            .bitmask = r->bitmask,
            .eos_forbid = r->eos_forbid,
            .n_eos_forbid = r->n_eos_forbid,
        };
        /* the CPU sampler takes a NULL history of length 0; the GPU one
         * reads NULL as "no history given" and refuses penalties then */
        static const int32_t none[1] = {0};
        if (!d->rows[k].prompt_ids && !r->n_prompt) d->rows[k].prompt_ids = none;
    }
    int rc = zi_cuda_sampler_sample_full_async(d->cs, d->logits, d->ld, d->rows, n_rows, err);
    const int32_t *tok = NULL;
    if (!rc) rc = zi_cuda_sampler_wait(d->cs, &tok, err);
    if (rc && rc != ZI_ERANGE) return rc;
    memcpy(out, tok, (size_t)n_rows * sizeof *out);
    for (int k = 0; k < n_rows; k++) d->count += out[k] >= 0;
    return rc;
}

int zi_device_sampler_finish(zi_device_sampler *d, zi_error *err) {
    return d->be->ops->sync(d->be, err);
}

uint64_t zi_device_sampler_count(const zi_device_sampler *d) {
    return d ? d->count : 0;
}

#else /* no CUDA: never a bridge */

int zi_device_sampler_compiled(void) {
    return 0;
}

int zi_device_sampler_create(zi_model *m, int32_t n_vocab, int max_rows, zi_device_sampler **out,
                             zi_error *err) {
    (void)m, (void)n_vocab, (void)max_rows, (void)err;
    *out = NULL;
    return ZI_OK;
}

void zi_device_sampler_free(zi_device_sampler *d) {
    (void)d;
}

int zi_device_sampler_forward(zi_device_sampler *d, zi_kv_cache *kv, const zi_batch *b,
                              zi_error *err) {
    (void)d, (void)kv, (void)b;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

int zi_device_sampler_sample(zi_device_sampler *d, const zi_sampler_row *rows, const int *src_row,
                             int n_rows, int32_t *out, zi_error *err) {
    (void)d, (void)rows, (void)src_row, (void)n_rows, (void)out;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

int zi_device_sampler_finish(zi_device_sampler *d, zi_error *err) {
    (void)d;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

uint64_t zi_device_sampler_count(const zi_device_sampler *d) {
    (void)d;
    return 0;
}

#endif
