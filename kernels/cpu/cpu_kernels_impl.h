/*
 * cpu_kernels_impl.h - the body of the CPU kernels, compiled once per
 * instruction set (see cpu_kernels.h). Not a normal header: each of
 * kernels_scalar.c, kernels_avx2.c and kernels_avx512.c defines
 * ZI_KERNELS_TABLE and ZI_KERNELS_ISA and includes this file once; the
 * compiler flags of that file (kernels/meson.build) decide which of the #if
 * branches in the units below are live:
 *   scalar   no flags: only the plain C paths.
 *   AVX2     -mavx2 -mfma -mf16c: __AVX2__, __FMA__, __F16C__.
 *   AVX-512  the AVX2 flags and -mavx512f/bw/vl/vnni: __AVX512F__ and
 *            ZI_HAVE_VNNI as well; AMX (ZI_HAVE_AMX) by a target attribute
 *            on its own functions, chosen at run time.
 * Each unit's top comment says which of its parts each table compiles.
 *
 * Every block dot product computes, in integers, sum(wq[i] * aq[i]) for one
 * 32-value block and scales it by the two block scales in float, so every
 * table returns the same integer partial sums; tables differ only in the
 * order of the float additions.
 *
 * The units, each relying on those before it:
 */
#include "cpu_kernels_common.h"      /* includes, ZI_HAVE_VNNI, load_f16, tree16 */
#include "cpu_kernels_quantize.h"    /* quantize_act */
#include "cpu_kernels_matmul.h"      /* quantized and float products, dot_f32 */
#include "cpu_kernels_r16x.h"        /* mm_r16x (the extended layout), avx2's mm_r16_any */
#include "cpu_kernels_amx.h"         /* mm_r16_amx, avx512's mm_r16_any */
#include "cpu_kernels_elementwise.h" /* axpy, scale, to_f16, SwiGLU, vector expf */
#include "cpu_kernels_attention.h"   /* attend */
#include "cpu_kernels_attention_q.h" /* attend_kv: attend over every --kv-type */
#include "cpu_kernels_recurrent.h"   /* silu, sigmoid_mul, delta_rule, ssm_run */

const zi_cpu_kernels ZI_KERNELS_TABLE = {
    .isa = ZI_KERNELS_ISA,
    .quantize_act = quantize_act,
    .mm_q4_0 = mm_q4_0,
    .mm_q4_1 = mm_q4_1,
    .mm_q8_0 = mm_q8_0,
    .mm_f32 = mm_f32,
    .mm_f16 = mm_f16,
    .mm_bf16 = mm_bf16,
    .attend = attend_kv,
    .attend_block = attend_block_kv,
#if defined(__AVX2__)
    .mm_r16 = mm_r16_any,
#endif
#if defined(ZI_HAVE_AMX)
    .amx = amx_usable,
#endif
    .dot = dot_f32,
    .dot4 = dot4_f32,
    .axpy = axpy_f32,
    .lora_up = lora_up,
    .lora_down = lora_down,
    .scale = scale_f32,
    .swiglu = swiglu_f32,
    .geglu = geglu_f32,
    .silu = silu_f32,
    .sigmoid_mul = sigmoid_mul_f32,
    .delta_rule = delta_rule_f32,
    .ssm_run = ssm_run_f32,
    .to_f16 = to_f16,
};
