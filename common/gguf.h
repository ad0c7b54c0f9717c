/*
 * gguf.h - a read-only, memory-mapped reader for GGUF model files (v2, v3).
 *
 * GGUF is zinfer's native model format: a header, a table of typed metadata
 * key/values, a tensor table, then tensor data at an aligned offset.
 * zi_gguf_open() maps the file and validates *everything* up front: every
 * length, count, type tag, string, array, tensor shape, tensor type and data
 * range is checked against the file size before any pointer is handed out,
 * so later accessors never read out of bounds. A truncated, corrupt or
 * hostile file yields ZI_EFORMAT (or ZI_EUNSUPPORTED for a version or tensor
 * type zinfer cannot use) with a message naming the offending key, tensor or
 * byte offset; it never crashes the process. zi_gguf_open_flags with
 * ZI_GGUF_ANY_TYPE opens a file whatever its tensor types, for tools that
 * describe a file rather than run it (`zinfer info`).
 *
 * Strings in a GGUF file are not NUL-terminated; zi_str points into the
 * mapping and carries a length. All pointers stay valid until zi_gguf_close.
 */
#ifndef ZI_GGUF_H
#define ZI_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum zi_gguf_type {
    ZI_GGUF_UINT8 = 0,
    ZI_GGUF_INT8 = 1,
    ZI_GGUF_UINT16 = 2,
    ZI_GGUF_INT16 = 3,
    ZI_GGUF_UINT32 = 4,
    ZI_GGUF_INT32 = 5,
    ZI_GGUF_FLOAT32 = 6,
    ZI_GGUF_BOOL = 7,
    ZI_GGUF_STRING = 8,
    ZI_GGUF_ARRAY = 9,
    ZI_GGUF_UINT64 = 10,
    ZI_GGUF_INT64 = 11,
    ZI_GGUF_FLOAT64 = 12,
} zi_gguf_type;

/* Tensor element types, numbered as ggml numbers them in GGUF files. Only
 * the types listed here can be opened by default (any mix in one file;
 * zi_ggml_type_supported); zi_gguf_open rejects any other tensor type with
 * ZI_EUNSUPPORTED naming the tensor and the type. With ZI_GGUF_ANY_TYPE a
 * tensor's type may be any number the file holds (read it as uint32_t).
 * Block layouts: docs/gguf.md and kernels/cpu/dequant.c. */
typedef enum zi_ggml_type {
    ZI_TYPE_F32 = 0,
    ZI_TYPE_F16 = 1,
    ZI_TYPE_Q4_0 = 2,
    ZI_TYPE_Q4_1 = 3,
    ZI_TYPE_Q5_0 = 6,
    ZI_TYPE_Q5_1 = 7,
    ZI_TYPE_Q8_0 = 8,
    ZI_TYPE_Q2_K = 10,
    ZI_TYPE_Q3_K = 11,
    ZI_TYPE_Q4_K = 12,
    ZI_TYPE_Q5_K = 13,
    ZI_TYPE_Q6_K = 14,
    ZI_TYPE_IQ4_NL = 20,
    ZI_TYPE_IQ4_XS = 23,
    ZI_TYPE_BF16 = 30,
    ZI_TYPE_MXFP4 = 39, /* gpt-oss's expert tensors */
} zi_ggml_type;

typedef struct zi_str {
    const char *ptr; /* not NUL-terminated; points into the mapping */
    uint64_t len;
} zi_str;

/* One metadata entry. For scalars `data` points at the little-endian value;
 * for strings at the first byte of the string (length in str.len); for arrays
 * at the first element, with arr_type and arr_len describing them. */
typedef struct zi_gguf_kv {
    zi_str key;
    zi_gguf_type type;
    zi_gguf_type arr_type; /* element type when type == ZI_GGUF_ARRAY */
    uint64_t arr_len;      /* element count when type == ZI_GGUF_ARRAY */
    zi_str str;            /* the value when type == ZI_GGUF_STRING */
    const uint8_t *data;
} zi_gguf_kv;

#define ZI_GGUF_MAX_DIMS 4

typedef struct zi_gguf_tensor {
    zi_str name;
    uint32_t n_dims;
    int64_t ne[ZI_GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length); unused dims are 1 */
    zi_ggml_type type;
    uint64_t offset;  /* relative to the start of the data section */
    uint64_t nbytes;  /* size of the tensor's data */
    const void *data; /* into the mapping; aligned to the file's alignment */
    /* 1 only under ZI_GGUF_ANY_TYPE, for a type number ggml does not define
     * (zi_ggml_type_block returns 0): the byte size is unknown, so nbytes
     * is 0, data is NULL and the data range was not checked (the offset's
     * alignment was). 0 otherwise. */
    int size_unknown;
} zi_gguf_tensor;

typedef struct zi_gguf zi_gguf;

/* Maps and validates the file at path. On success *out owns the mapping. */
int zi_gguf_open(const char *path, zi_gguf **out, zi_error *err);

/* Same, over a caller-owned buffer (tests, fuzzing); buf must outlive *out. */
int zi_gguf_open_memory(const void *buf, size_t len, zi_gguf **out, zi_error *err);

/*
 * Open options, or-ed into `flags` (0 is zi_gguf_open's behaviour; another
 * bit gives ZI_EINVAL):
 *
 * ZI_GGUF_ANY_TYPE keeps tensors of every type with the type the file
 * gives, instead of failing on the first one zinfer cannot run. A type
 * whose block geometry ggml defines (zi_ggml_type_block) is checked as a
 * supported one is: whole blocks per row, sizes, aligned offset, data
 * inside the file. A type number ggml does not define has no known size:
 * the tensor is kept with size_unknown set (see zi_gguf_tensor); its shape
 * and offset alignment are still checked. Every other check, and every
 * message, is as without the flag. The caller must test each tensor with
 * zi_ggml_type_supported before handing it to anything that computes with
 * it; zi_model_load opens without the flag, so it refuses such files.
 */
#define ZI_GGUF_ANY_TYPE 1u
int zi_gguf_open_flags(const char *path, unsigned flags, zi_gguf **out, zi_error *err);
int zi_gguf_open_memory_flags(const void *buf, size_t len, unsigned flags, zi_gguf **out,
                              zi_error *err);

void zi_gguf_close(zi_gguf *g);

uint32_t zi_gguf_version(const zi_gguf *g);
uint32_t zi_gguf_alignment(const zi_gguf *g);
size_t zi_gguf_file_size(const zi_gguf *g);

/* Metadata, in file order. */
uint64_t zi_gguf_kv_count(const zi_gguf *g);
const zi_gguf_kv *zi_gguf_kv_at(const zi_gguf *g, uint64_t i);
/* NULL when the key is absent. */
const zi_gguf_kv *zi_gguf_find_kv(const zi_gguf *g, const char *key);

/*
 * Typed getters. Each returns ZI_OK and stores the value, or: ZI_EINVAL
 * ("missing key K") when absent, ZI_EFORMAT ("key K has type T, expected
 * ...") when the type is wrong. Integer getters accept any integer type whose
 * value fits the destination; zi_gguf_get_f32 accepts FLOAT32 and FLOAT64.
 * The *_or variants return `dflt` when the key is absent (still failing on a
 * wrong type).
 */
int zi_gguf_get_u32(const zi_gguf *g, const char *key, uint32_t *out, zi_error *err);
int zi_gguf_get_u32_or(const zi_gguf *g, const char *key, uint32_t dflt, uint32_t *out,
                       zi_error *err);
int zi_gguf_get_i64(const zi_gguf *g, const char *key, int64_t *out, zi_error *err);
int zi_gguf_get_f32(const zi_gguf *g, const char *key, float *out, zi_error *err);
int zi_gguf_get_f32_or(const zi_gguf *g, const char *key, float dflt, float *out, zi_error *err);
int zi_gguf_get_bool_or(const zi_gguf *g, const char *key, int dflt, int *out, zi_error *err);
int zi_gguf_get_str(const zi_gguf *g, const char *key, zi_str *out, zi_error *err);

/* A string array as a freshly malloc'd vector of zi_str (free() it); the
 * strings themselves point into the mapping. */
int zi_gguf_get_str_array(const zi_gguf *g, const char *key, zi_str **out, uint64_t *n,
                          zi_error *err);
/* A numeric array whose elements have type `want` (exact match), returned as
 * a pointer into the mapping (little-endian, possibly unaligned: read with
 * memcpy) and its length. */
int zi_gguf_get_array(const zi_gguf *g, const char *key, zi_gguf_type want, const void **data,
                      uint64_t *n, zi_error *err);

/* Tensors, in file order. */
uint64_t zi_gguf_tensor_count(const zi_gguf *g);
const zi_gguf_tensor *zi_gguf_tensor_at(const zi_gguf *g, uint64_t i);
/* NULL when absent. */
const zi_gguf_tensor *zi_gguf_find_tensor(const zi_gguf *g, const char *name);

/* Tells the kernel that the tensor's pages of a mapped file are not needed
 * now (a backend copied them); later reads fault them back in. A no-op for
 * zi_gguf_open_memory buffers. */
void zi_gguf_drop_pages(const zi_gguf *g, const zi_gguf_tensor *t);

/* Name of a metadata type / tensor type ("uint32", "Q4_1", "IQ2_XXS");
 * "?" if unknown (for a tensor type: a number ggml does not define). */
const char *zi_gguf_type_name(zi_gguf_type t);
const char *zi_ggml_type_name(int t);
/* True when zinfer reads and computes with tensor type t: the types of
 * zi_ggml_type, which zi_gguf_open accepts without ZI_GGUF_ANY_TYPE. */
int zi_ggml_type_supported(int t);
/* Block geometry of any type ggml defines, supported or not: values per
 * block in *elems and bytes per block in *bytes (either may be NULL).
 * Returns 1, or 0 (and zeros) for a number ggml does not define. */
int zi_ggml_type_block(int t, size_t *elems, size_t *bytes);
/* Bytes per block and elements per block of a tensor type: 0 for a type
 * zinfer cannot open, so a nonzero value means the type is supported. */
size_t zi_ggml_type_block_bytes(int t);
size_t zi_ggml_type_block_elems(int t);

/* True when s equals the NUL-terminated c string. */
int zi_str_eq(zi_str s, const char *c);

#endif
