/*
 * kernels_avx2.c - the CPU kernels compiled for the "avx2" instruction set
 * (the flags come from kernels/meson.build; cpu_kernels_impl.h and the units
 * it includes say which parts each set compiles). See cpu_kernels.h.
 */
#define ZI_KERNELS_TABLE zi_cpu_kernels_avx2
#define ZI_KERNELS_ISA "avx2"
#include "cpu_kernels_impl.h"
