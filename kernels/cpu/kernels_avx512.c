/*
 * kernels_avx512.c - the CPU kernels compiled for the "avx512" instruction set
 * (the flags come from kernels/meson.build; cpu_kernels_impl.h and the units
 * it includes say which parts each set compiles). See cpu_kernels.h.
 */
#define ZI_KERNELS_TABLE zi_cpu_kernels_avx512
#define ZI_KERNELS_ISA "avx512"
#include "cpu_kernels_impl.h"
