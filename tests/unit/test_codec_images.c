/*
 * test_codec_images.c - a TextContext's images (types.h's zi_ctx_image):
 * zi_text_context_add_image writes the keys, the codec carries the images
 * through a round trip bit for bit, and the decoder refuses every broken
 * image with a message naming images[i].field (or the token at fault).
 * Mutations edit the unpacked msgpack tree of a good context and pack it
 * again, so each case breaks exactly one thing.
 */
#include "test_codec_util.h"

#include <stdio.h>

#define PLEN 20

/* Pixels of n_tiles tiles of side s, a pattern seeded by seed. */
static float *pixels_of(int n_tiles, int s, int seed) {
    size_t n = (size_t)n_tiles * (size_t)s * (size_t)s * 3;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)((int)(i * 7 + (size_t)seed * 13) % 17) / 8.0f - 1;
    return p;
}

static void make_image(zi_ctx_image *im, int n_tiles, int side, int tokens, const int32_t *first,
                       bool non_causal, int seed) {
    memset(im, 0, sizeof *im);
    im->n_tiles = n_tiles;
    im->tile_size = side;
    im->tile_tokens = tokens;
    im->non_causal = non_causal;
    im->tile_first = malloc((size_t)n_tiles * sizeof *im->tile_first);
    memcpy(im->tile_first, first, (size_t)n_tiles * sizeof *first);
    im->pixels = pixels_of(n_tiles, side, seed);
    im->hash = zi_ctx_image_hash(im->pixels, (size_t)n_tiles * (size_t)side * (size_t)side * 3);
}

/* A context of PLEN tokens with two images: image 0 two non_causal tiles
 * of 3 tokens at 2 and 7 (text between them), image 1 one causal tile of
 * 4 tokens at 12. */
static void make_context(zi_text_context *c) {
    int32_t prompt[PLEN];
    for (int i = 0; i < PLEN; i++) prompt[i] = 100 + i;
    zi_error e = {0};
    assert_int_equal(zi_text_context_init(c, prompt, PLEN, 64, NULL, &e), ZI_OK);
    zi_ctx_image im;
    make_image(&im, 2, 2, 3, (const int32_t[]){2, 7}, true, 1);
    assert_int_equal(zi_text_context_add_image(c, &im, &e), ZI_OK);
    assert_null(im.pixels); /* taken over */
    make_image(&im, 1, 3, 4, (const int32_t[]){12}, false, 2);
    assert_int_equal(zi_text_context_add_image(c, &im, &e), ZI_OK);
}

static void test_keys(void **state) {
    (void)state;
    /* the derivation is pinned: the tokenizer (C or Python) makes the same */
    assert_int_equal(zi_ctx_image_key(0x0123456789ABCDEFull, 0), -1193066522);
    assert_int_equal(zi_ctx_image_key(0x0123456789ABCDEFull, 255), -1084017835);
    assert_int_equal(zi_ctx_image_key(0, 0), -1896895517);
    for (int k = 0; k < 1000; k++) {
        assert_true(zi_ctx_image_key(12345, k) < 0);
        assert_true(zi_ctx_image_key(12345, k) != zi_ctx_image_key(12346, k));
    }
    float a[3] = {0.0f, 1.0f, 2.0f}, b[3] = {-0.0f, 1.0f, 2.0f};
    assert_true(zi_ctx_image_hash(a, 3) != zi_ctx_image_hash(b, 3));
    assert_true(zi_ctx_image_hash(a, 3) != zi_ctx_image_hash(a, 2));

    zi_text_context c;
    make_context(&c);
    zi_error e = {0};
    assert_int_equal(zi_text_context_check(&c, &e), ZI_OK);
    const zi_ctx_image *im = &c.images[0];
    assert_int_equal(c.tokens[2], zi_ctx_image_key(im->hash, 0));
    assert_int_equal(c.tokens[4], zi_ctx_image_key(im->hash, 2));
    assert_int_equal(c.tokens[7], zi_ctx_image_key(im->hash, 3)); /* tile 1, token 0 */
    assert_int_equal(c.tokens[5], 105);
    assert_int_equal(c.tokens[15], zi_ctx_image_key(c.images[1].hash, 3));
    size_t ii;
    int32_t t;
    assert_true(zi_text_context_soft_token(&c, 8, &ii, &t));
    assert_int_equal(ii, 0);
    assert_int_equal(t, 1);
    assert_true(zi_text_context_soft_token(&c, 13, &ii, &t));
    assert_int_equal(ii, 1);
    assert_false(zi_text_context_soft_token(&c, 5, NULL, NULL));
    assert_false(zi_text_context_soft_token(&c, 16, NULL, NULL));

    /* refusals of add_image leave both sides as they were */
    zi_ctx_image bad;
    make_image(&bad, 1, 2, 3, (const int32_t[]){14}, false, 3); /* overlaps image 1 */
    assert_int_equal(zi_text_context_add_image(&c, &bad, &e), ZI_EINVAL);
    ERR_HAS(e, "images[2].tile_first[0]");
    assert_non_null(bad.pixels);
    bad.tile_first[0] = 18; /* 18..20 runs past the prompt */
    assert_int_equal(zi_text_context_add_image(&c, &bad, &e), ZI_EINVAL);
    ERR_HAS(e, "images[2].tile_first[0]");
    bad.tile_first[0] = 16;
    bad.hash ^= 1;
    assert_int_equal(zi_text_context_add_image(&c, &bad, &e), ZI_EINVAL);
    ERR_HAS(e, "images[2].hash: does not match the pixels");
    bad.hash ^= 1;
    bad.pixels[5] = NAN;
    assert_int_equal(zi_text_context_add_image(&c, &bad, &e), ZI_EINVAL);
    ERR_HAS(e, "images[2].pixels: value 5 is not finite");
    assert_int_equal(c.n_images, 2);
    zi_ctx_image_free(&bad);

    /* a key broken by hand, and a negative id outside the images */
    int32_t keep = c.tokens[3];
    c.tokens[3] = 7;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    ERR_HAS(e, "tokens[3]: 7 is not images[0]'s key");
    c.tokens[3] = keep;
    c.tokens[0] = -5;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    ERR_HAS(e, "tokens[0]: -5 is not a token id");
    zi_text_context_free(&c);
}

static void test_roundtrip(void **state) {
    (void)state;
    zi_text_context c, d;
    make_context(&c);
    /* the worker's side stays behind */
    c.images[0].embd = calloc(6 * 4, sizeof(float));
    c.images[0].tile_encoded = calloc(2, 1);
    zi_error e = {0};
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &d, &e), ZI_OK);
    assert_int_equal(d.n_images, 2);
    assert_int_equal(d.end_idx, c.end_idx);
    assert_memory_equal(d.tokens, c.tokens, (size_t)c.end_idx * sizeof *c.tokens);
    for (size_t i = 0; i < 2; i++) {
        const zi_ctx_image *a = &c.images[i], *b = &d.images[i];
        assert_true(a->hash == b->hash);
        assert_int_equal(a->n_tiles, b->n_tiles);
        assert_int_equal(a->tile_size, b->tile_size);
        assert_int_equal(a->tile_tokens, b->tile_tokens);
        assert_int_equal(a->non_causal, b->non_causal);
        assert_memory_equal(a->tile_first, b->tile_first, (size_t)a->n_tiles * sizeof(int32_t));
        size_t n = (size_t)a->n_tiles * (size_t)a->tile_size * (size_t)a->tile_size * 3;
        assert_memory_equal(a->pixels, b->pixels, n * sizeof(float));
        assert_null(b->embd);
        assert_null(b->tile_encoded);
    }
    /* a context without images writes no "images" key */
    zi_text_context p;
    int32_t ids[3] = {1, 2, 3};
    assert_int_equal(zi_text_context_init(&p, ids, 3, 10, NULL, &e), ZI_OK);
    char *pb;
    size_t pl;
    assert_int_equal(zi_codec_text_context_to_bytes(&p, &pb, &pl, &e), ZI_OK);
    msgpack_unpacked u;
    assert_int_equal(zi_msgpack_parse(pb, pl, NULL, &u, &e), ZI_OK);
    assert_null(zi_map_get(&u.data, "images"));
    msgpack_unpacked_destroy(&u);
    free(pb);
    zi_text_context_free(&p);
    free(buf);
    zi_text_context_free(&c);
    zi_text_context_free(&d);
}

/* ---- mutations of a good context's msgpack tree ---------------------------- */

static bool is_key(const msgpack_object *k, const char *name) {
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
           memcmp(k->via.str.ptr, name, k->via.str.size) == 0;
}

/* The value under key in map o (mutable), or fails. */
static msgpack_object *val(msgpack_object *o, const char *key) {
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < o->via.map.size; i++)
        if (is_key(&o->via.map.ptr[i].key, key)) return &o->via.map.ptr[i].val;
    fail_msg("no key %s", key);
    return NULL;
}

static msgpack_object *image(msgpack_object *root, int i) {
    return &val(root, "images")->via.array.ptr[i];
}

typedef void (*mutation)(msgpack_object *root, void *arg);

/* Encodes the good context, applies m to its tree, packs the tree again
 * and decodes it: ZI_EINVAL with a message containing want. */
static void refused(mutation m, void *arg, const char *want) {
    zi_text_context c, d;
    make_context(&c);
    zi_error e = {0};
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    msgpack_unpacked u;
    assert_int_equal(zi_msgpack_parse(buf, len, NULL, &u, &e), ZI_OK);
    m(&u.data, arg);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(msgpack_pack_object(&pk, u.data), 0);
    int rc = zi_codec_text_context_from_bytes(sb.data, sb.size, NULL, &d, &e);
    if (rc != ZI_EINVAL) fail_msg("expected a refusal with \"%s\", got %d (%s)", want, rc, e.msg);
    ERR_HAS(e, want);
    assert_null(d.images); /* left empty */
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    free(buf);
    zi_text_context_free(&c);
}

typedef struct field_int {
    int image;
    const char *key;
    long long v;
} field_int;

static void set_int(msgpack_object *root, void *arg) {
    field_int *f = arg;
    msgpack_object *o = val(image(root, f->image), f->key);
    o->type = f->v < 0 ? MSGPACK_OBJECT_NEGATIVE_INTEGER : MSGPACK_OBJECT_POSITIVE_INTEGER;
    o->via.i64 = f->v;
}

static void set_str(msgpack_object *root, void *arg) {
    msgpack_object *o = val(image(root, 0), arg);
    o->type = MSGPACK_OBJECT_STR;
    o->via.str.ptr = "x";
    o->via.str.size = 1;
}

/* Drops key arg of image 0 (the last entry takes its place). */
static void drop_key(msgpack_object *root, void *arg) {
    msgpack_object *im = image(root, 0);
    for (uint32_t i = 0; i < im->via.map.size; i++)
        if (is_key(&im->via.map.ptr[i].key, arg)) {
            im->via.map.ptr[i] = im->via.map.ptr[im->via.map.size - 1];
            im->via.map.size--;
            return;
        }
}

static void rename_key(msgpack_object *root, void *arg) {
    (void)arg;
    msgpack_object *k = &image(root, 0)->via.map.ptr[0].key;
    k->via.str.ptr = "colour";
    k->via.str.size = 6;
}

static void short_pixels(msgpack_object *root, void *arg) {
    (void)arg;
    val(image(root, 1), "pixels")->via.bin.size -= 4;
}

static uint8_t g_px[4096];

/* Copies image arg's pixels into g_px (writable) and sets bytes [at, at+4)
 * to a NaN. */
static void nan_pixel(msgpack_object *root, void *arg) {
    msgpack_object *p = val(image(root, *(int *)arg), "pixels");
    memcpy(g_px, p->via.bin.ptr, p->via.bin.size);
    uint32_t nan = 0x7FC00000u;
    memcpy(g_px + 8, &nan, 4);
    p->via.bin.ptr = (const char *)g_px;
}

static void other_pixel(msgpack_object *root, void *arg) {
    (void)arg;
    msgpack_object *p = val(image(root, 0), "pixels");
    memcpy(g_px, p->via.bin.ptr, p->via.bin.size);
    g_px[0] ^= 1; /* still finite: only the hash sees it */
    p->via.bin.ptr = (const char *)g_px;
}

static int32_t g_ids[2];

/* tile_first of image 0 as a plain array (a, b). */
static void set_first(msgpack_object *root, void *arg) {
    static msgpack_object items[2];
    int32_t *ab = arg;
    msgpack_object *o = val(image(root, 0), "tile_first");
    for (int i = 0; i < 2; i++) {
        items[i].type =
            ab[i] < 0 ? MSGPACK_OBJECT_NEGATIVE_INTEGER : MSGPACK_OBJECT_POSITIVE_INTEGER;
        items[i].via.i64 = ab[i];
    }
    o->type = MSGPACK_OBJECT_ARRAY;
    o->via.array.ptr = items;
    o->via.array.size = 2;
}

/* tokens as a plain array of PLEN ids: the context's, with [at] = v. */
static int32_t g_tok_at, g_tok_v;
static void set_token(msgpack_object *root, void *arg) {
    static msgpack_object items[PLEN];
    zi_text_context *c = arg;
    for (int i = 0; i < PLEN; i++) {
        int64_t v = i == g_tok_at ? g_tok_v : c->tokens[i];
        items[i].type = v < 0 ? MSGPACK_OBJECT_NEGATIVE_INTEGER : MSGPACK_OBJECT_POSITIVE_INTEGER;
        items[i].via.i64 = v;
    }
    msgpack_object *o = val(root, "tokens");
    o->type = MSGPACK_OBJECT_ARRAY;
    o->via.array.ptr = items;
    o->via.array.size = PLEN;
}

static void not_array(msgpack_object *root, void *arg) {
    (void)arg;
    msgpack_object *o = val(root, "images");
    o->type = MSGPACK_OBJECT_BOOLEAN;
    o->via.boolean = true;
}

static void test_refusals(void **state) {
    (void)state;
    field_int f;
    f = (field_int){0, "hash", -3};
    refused(set_int, &f, "images[0].hash: -3 is negative");
    refused(set_str, "hash", "images[0].hash: expected an unsigned 64-bit integer");
    f = (field_int){0, "n_tiles", 0};
    refused(set_int, &f, "images[0].n_tiles: 0 is outside");
    f = (field_int){0, "n_tiles", 3};
    refused(set_int, &f, "images[0].tile_first: 2 positions for 3 tiles");
    f = (field_int){1, "tile_size", 0};
    refused(set_int, &f, "images[1].tile_size: 0 is outside");
    f = (field_int){1, "tile_size", 9000};
    refused(set_int, &f, "images[1].tile_size: 9000 is outside");
    f = (field_int){1, "tile_size", 2}; /* fewer pixels than sent */
    refused(set_int, &f, "images[1].pixels: 108 bytes, but 1 tiles of 2 x 2 x 3 float32 are 48");
    f = (field_int){0, "tile_tokens", 0};
    refused(set_int, &f, "images[0].tile_tokens: 0 is outside");
    f = (field_int){0, "tile_tokens", 4}; /* tile 0 then runs into tile 1... no: 2..5, 7..10 */
    refused(set_int, &f, "tokens[5]: 105 is not images[0]'s key");
    f = (field_int){0, "tile_tokens", 6}; /* 2..7 overlaps tile 1 at 7 */
    refused(set_int, &f, "images[0].tile_first[1]");
    refused(set_str, "non_causal", "images[0].non_causal: expected a boolean");
    refused(set_str, "pixels", "images[0].pixels: expected bytes");
    refused(drop_key, "non_causal", "images[0].non_causal: missing required field");
    refused(drop_key, "pixels", "images[0].pixels: missing required field");
    refused(rename_key, NULL, "images[0]");
    refused(short_pixels, NULL, "images[1].pixels: 104 bytes, but");
    int which = 1;
    refused(nan_pixel, &which, "images[1].pixels: value 2 is not finite");
    refused(other_pixel, NULL, "images[0].hash: does not match the pixels");
    refused(not_array, NULL, "images: expected an array of images");
    g_ids[0] = 2, g_ids[1] = 18; /* tile 1 at 18..20: past the prompt */
    refused(set_first, g_ids, "images[0].tile_first[1]: tokens 18..20 are not inside");
    g_ids[0] = 7, g_ids[1] = 2; /* out of order */
    refused(set_first, g_ids, "images[0].tile_first[1]");
    g_ids[0] = -1, g_ids[1] = 7;
    refused(set_first, g_ids, "images[0].tile_first");
    g_ids[0] = 2, g_ids[1] = 12; /* image 1's tile at 12 then overlaps */
    refused(set_first, g_ids, "images[1].tile_first[0]");

    zi_text_context c;
    make_context(&c);
    g_tok_at = 3, g_tok_v = 103; /* a soft token that is not its key */
    refused(set_token, &c, "tokens[3]: 103 is not images[0]'s key");
    g_tok_at = 5, g_tok_v = -9; /* a negative id outside the images */
    refused(set_token, &c, "tokens[5]: -9 is not a token id");
    g_tok_at = 13, g_tok_v = c.tokens[2]; /* image 0's key in image 1's place */
    refused(set_token, &c, "tokens[13]");
    zi_text_context_free(&c);

    /* more images than the limit */
    zi_codec_limits lim = zi_codec_limits_default();
    lim.max_images = 1;
    make_context(&c);
    zi_error e = {0};
    char *buf;
    size_t len;
    zi_text_context d;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, &lim, &d, &e), ZI_EINVAL);
    ERR_HAS(e, "images: 2 images exceed the limit of 1");
    free(buf);
    zi_text_context_free(&c);
}

/* A Gemma 3 sized image (one 896 px tile, 256 soft tokens, 9.6 MB of
 * pixels) travels within the default limits; a negative id in a context
 * without images is refused. */
static void test_large_and_plain(void **state) {
    (void)state;
    enum { N = 300 };
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = i;
    zi_text_context c, d;
    zi_error e = {0};
    assert_int_equal(zi_text_context_init(&c, prompt, N, 1000, NULL, &e), ZI_OK);
    zi_ctx_image im;
    make_image(&im, 1, 896, 256, (const int32_t[]){10}, true, 4);
    assert_int_equal(zi_text_context_add_image(&c, &im, &e), ZI_OK);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_true(len > (size_t)896 * 896 * 12);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &d, &e), ZI_OK);
    assert_true(d.images[0].hash == c.images[0].hash);
    assert_memory_equal(d.images[0].pixels, c.images[0].pixels, (size_t)896 * 896 * 12);
    free(buf);
    zi_text_context_free(&c);
    zi_text_context_free(&d);

    assert_int_equal(zi_text_context_init(&c, prompt, 5, 100, NULL, &e), ZI_OK);
    c.tokens[2] = -1;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_EINVAL);
    ERR_HAS(e, "tokens[2]: -1 is not a token id");
    zi_text_context_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_large_and_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
