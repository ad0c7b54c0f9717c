/*
 * cpu_kernels.c - run-time choice of the kernel table (see cpu_kernels.h).
 */
#include "cpu_kernels.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

/* F16C from CPUID leaf 1 (ECX bit 29) rather than __builtin_cpu_supports:
 * clang before 15 does not know the name "f16c" and refuses to compile. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

const zi_cpu_kernels *zi_cpu_kernels_by_name(const char *isa) {
    if (strcmp(isa, "scalar") == 0) return &zi_cpu_kernels_scalar;
    if (strcmp(isa, "avx2") == 0) return cpu_has_avx2() ? &zi_cpu_kernels_avx2 : NULL;
    if (strcmp(isa, "avx512") == 0) return cpu_has_avx512() ? &zi_cpu_kernels_avx512 : NULL;
    return NULL;
}

const zi_cpu_kernels *zi_cpu_kernels_select(void) {
    const char *forced = getenv("ZINFER_CPU_ISA");
    if (forced && *forced) return zi_cpu_kernels_by_name(forced);
    if (cpu_has_avx512()) return &zi_cpu_kernels_avx512;
    if (cpu_has_avx2()) return &zi_cpu_kernels_avx2;
    return &zi_cpu_kernels_scalar;
}
