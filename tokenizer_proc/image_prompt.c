/*
 * image_prompt.c - see image_prompt.h.
 */
#include "image_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "types.h"

void zi_image_prompt_params(const zi_vision_config *c, zi_image_prep_params *pp) {
    zi_image_prep_params_default(pp, c->kind == ZI_VISION_GEMMA3 ? ZI_IMAGE_PROJ_GEMMA3
                                                                 : ZI_IMAGE_PROJ_IDEFICS3);
    pp->image_size = c->image_size, pp->patch_size = c->patch_size, pp->n_merge = c->n_merge;
    if (c->preproc_size > 0) pp->longest_edge = c->preproc_size;
    memcpy(pp->mean, c->mean, sizeof pp->mean);
    memcpy(pp->std, c->std, sizeof pp->std);
}

int zi_image_prompt_non_causal(const zi_vision_config *c) { return c->kind == ZI_VISION_GEMMA3; }

/* A growing list of ids. */
typedef struct id_buf {
    int32_t *p;
    size_t n, cap;
} id_buf;

static int push_ids(id_buf *b, const int32_t *ids, size_t n, zi_error *err) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        int32_t *np = realloc(b->p, cap * sizeof *np);
        if (!np) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        b->p = np, b->cap = cap;
    }
    memcpy(b->p + b->n, ids, n * sizeof *ids);
    b->n += n;
    return ZI_OK;
}

static int push_text(zi_tokenizer *tok, id_buf *b, const char *s, size_t n, int parse_special,
                     zi_error *err) {
    if (n == 0) return ZI_OK;
    int32_t *ids = NULL;
    size_t k = 0;
    int rc = zi_tokenizer_encode(tok, s, n, 0, parse_special, &ids, &k, err);
    if (!rc) rc = push_ids(b, ids, k, err);
    free(ids);
    return rc;
}

/* mtmd's lookup_token: the lowest id whose piece, special tokens
 * rendered, is exactly text. */
static int lookup_token(const zi_tokenizer *tok, const char *text, int32_t *out, zi_error *err) {
    const size_t len = strlen(text);
    char buf[256];
    for (int32_t id = 0; id < zi_tokenizer_vocab_size(tok); id++) {
        int n = zi_tokenizer_token_bytes(tok, id, 1, buf, sizeof buf);
        if (n == (int)len && memcmp(buf, text, len) == 0) {
            *out = id;
            return ZI_OK;
        }
    }
    return zi_error_set(err, ZI_EUNSUPPORTED,
                        "the vocabulary has no token '%s', which this projector's image layout "
                        "needs (a projector for another model?)",
                        text);
}

/* One image in place: its preparation and layout, appended to b. */
static int place_image(zi_tokenizer *tok, id_buf *b, const zi_image_rgb *img,
                       const zi_image_prep_params *pp, zi_prompt_image *pi, zi_error *err) {
    zi_image_tiles t = {0};
    zi_image_layout_item *items = NULL;
    size_t n_items = 0;
    int rc = zi_image_prep(img, pp, &t, err);
    if (!rc) {
        rc = zi_image_layout(pp, &t, NULL, 0, &n_items, err);
        if (rc == ZI_ERANGE) zi_error_clear(err), rc = ZI_OK;
    }
    if (!rc && !(items = calloc(n_items ? n_items : 1, sizeof *items)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc) rc = zi_image_layout(pp, &t, items, n_items, &n_items, err);
    if (!rc) {
        pi->n_tiles = t.n_tiles, pi->tile_size = t.tile_size, pi->tile_tokens = t.tokens_per_tile;
        pi->hash = zi_ctx_image_hash(t.data, (size_t)t.n_tiles * t.tile_size * t.tile_size * 3);
        pi->pixels = t.data, t.data = NULL;
        if (!(pi->tile_first = calloc((size_t)pi->n_tiles, sizeof *pi->tile_first)))
            rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    for (size_t i = 0; !rc && i < n_items; i++) {
        const zi_image_layout_item *it = &items[i];
        if (it->kind == ZI_IMAGE_LAYOUT_TEXT) {
            rc = push_text(tok, b, it->text, strlen(it->text), 1, err);
        } else if (it->kind == ZI_IMAGE_LAYOUT_TOKEN) {
            int32_t id = -1;
            rc = lookup_token(tok, it->text, &id, err);
            if (!rc) rc = push_ids(b, &id, 1, err);
        } else {
            if (it->tile < 0 || it->tile >= pi->n_tiles || it->n_tokens != pi->tile_tokens) {
                rc = zi_error_set(err, ZI_EINVAL, "layout item %zu names tile %d of %d", i, it->tile,
                                  pi->n_tiles);
                break;
            }
            pi->tile_first[it->tile] = (int64_t)b->n;
            for (int k = 0; !rc && k < it->n_tokens; k++) {
                int32_t key = zi_ctx_image_key(pi->hash, (int64_t)it->tile * pi->tile_tokens + k);
                rc = push_ids(b, &key, 1, err);
            }
        }
    }
    free(items);
    zi_image_tiles_free(&t);
    return rc;
}

int zi_image_prompt_build(zi_tokenizer *tok, const char *text, size_t len, int add_special,
                          int parse_special, const zi_image_rgb *imgs, size_t n_images,
                          const zi_image_prep_params *pp, int32_t **ids, size_t *n_ids,
                          zi_prompt_image **images, zi_error *err) {
    *ids = NULL, *n_ids = 0, *images = NULL;
    const size_t n_markers = zi_media_marker_count(text, len);
    if (n_markers != n_images)
        return zi_error_set(err, ZI_EINVAL, "%zu images, but the prompt holds %zu %s markers",
                            n_images, n_markers, ZI_MEDIA_MARKER);
    id_buf b = {0};
    zi_prompt_image *pis = calloc(n_images ? n_images : 1, sizeof *pis);
    if (!pis) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    /* BOS and EOS where the vocabulary adds them: what an empty text gets. */
    int32_t *sp = NULL;
    size_t n_sp = 0;
    int rc = add_special ? zi_tokenizer_encode(tok, "", 0, 1, 0, &sp, &n_sp, err) : ZI_OK;
    const int32_t bos = zi_tokenizer_bos(tok), eos = zi_tokenizer_eos(tok);
    const int has_bos = n_sp > 0 && sp[0] == bos, has_eos = n_sp > 0 && sp[n_sp - 1] == eos &&
                                                             (n_sp > 1 || !has_bos);
    if (!rc && has_bos) rc = push_ids(&b, &bos, 1, err);
    const char *p = text, *end = text + len;
    const size_t ml = strlen(ZI_MEDIA_MARKER);
    for (size_t i = 0; !rc && i <= n_images; i++) {
        const char *m = i < n_images ? p : end;
        while (i < n_images && (size_t)(end - m) >= ml && memcmp(m, ZI_MEDIA_MARKER, ml) != 0) m++;
        rc = push_text(tok, &b, p, (size_t)(m - p), parse_special, err);
        if (rc || i == n_images) break;
        rc = place_image(tok, &b, &imgs[i], pp, &pis[i], err);
        if (rc) zi_error_prefix(err, "image %zu", i);
        p = m + ml;
    }
    if (!rc && has_eos) rc = push_ids(&b, &eos, 1, err);
    free(sp);
    if (!rc && b.n == 0) rc = zi_error_set(err, ZI_EINVAL, "the prompt is empty");
    if (rc) {
        free(b.p);
        zi_prompt_images_free(pis, n_images);
        return rc;
    }
    *ids = b.p, *n_ids = b.n, *images = pis;
    return ZI_OK;
}

void zi_prompt_images_free(zi_prompt_image *images, size_t n) {
    if (!images) return;
    for (size_t i = 0; i < n; i++) {
        free(images[i].tile_first);
        free(images[i].pixels);
    }
    free(images);
}
