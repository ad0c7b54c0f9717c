/*
 * dequant.h - scalar dequantization of a row of any GGUF tensor type zinfer
 * reads, to float32.
 *
 * One function, zi_dequantize_row, for every type the GGUF reader accepts
 * (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_NL, IQ4_XS, MXFP4). It is the ground truth of the engine: embedding
 * lookups use it, the CPU backend's matrix products for types without a
 * fast kernel dequantize each weight row with it, and the kernel tests
 * compare the SIMD kernels against it.
 *
 * Its results are bit-exact with the Python package `gguf`
 * (gguf.quants.dequantize, version 0.19): the same float32 operations in the
 * same order: each f16 scale is converted to float32 exactly, a sub-block's
 * scale is the product of the f16 scale and the integer sub-scale in
 * float32, and each value is that scale times the integer quant (minus the
 * float32 product of the f16 min and the sub-min, where the type has one).
 * MXFP4's scale is an E8M0 byte (a power of two), halved for its doubled
 * code book, exactly as ggml's ggml_e8m0_to_fp32_half.
 * tests/unit/test_dequant.c checks this bit for bit against a fixture
 * written with that package (scripts/ref/make_dequant_fixture.py). The
 * block layouts are the GGUF format's; docs/gguf.md lists them.
 *
 * NaN results (from a NaN or infinite scale in the file) are NaN here too,
 * but their sign and payload are whatever the hardware gives.
 */
#ifndef ZI_DEQUANT_H
#define ZI_DEQUANT_H

#include <stdint.h>

/* Values per block of the K-quants and IQ4_XS ("super-blocks"). */
#define ZI_QK_K 256

/*
 * Dequantizes the first n values of a row of `type` (a zi_ggml_type) at
 * `row` into y[0..n). n must be a multiple of the type's block size
 * (zi_ggml_type_block_elems); `row` need not be aligned. Returns ZI_OK, or
 * ZI_EUNSUPPORTED (y untouched) for a type it does not know: every type the
 * GGUF reader accepts is known, so a caller whose tensor came from the
 * reader may ignore the result.
 */
int zi_dequantize_row(int type, const void *row, float *y, int64_t n);

#endif
