/*
 * backend_select.h - chooses the compute backend from a device string, the
 * value of the binaries' --device flag, and lists what this build and this
 * machine offer (`zinfer devices`).
 *
 * Device strings: "cpu" (the default), "cuda" (CUDA device 0), "cuda:N"
 * (CUDA device N). Anything else is refused with a message that names the
 * string and the accepted forms. The CUDA backend exists only in builds
 * configured with nvcc on PATH (ZI_HAVE_CUDA, docs/cuda.md); asking such a
 * build for "cuda" fails with a message saying it was built without CUDA,
 * and asking a CUDA build on a machine without a usable GPU fails with the
 * CUDA runtime's own reason (no device, driver missing or too old).
 */
#ifndef ZI_BACKEND_SELECT_H
#define ZI_BACKEND_SELECT_H

#include <stdio.h>

#include "backend.h"
#include "zi_error.h"

typedef enum zi_device_kind { ZI_DEVICE_CPU = 0, ZI_DEVICE_CUDA = 1 } zi_device_kind;

typedef struct zi_device_spec {
    zi_device_kind kind;
    int index; /* the CUDA device ordinal (0 for "cuda"); 0 for the CPU */
} zi_device_spec;

/* The largest N accepted in "cuda:N". */
#define ZI_DEVICE_INDEX_MAX 1023

/* Parses a device string (NULL means "cpu"). ZI_EINVAL with a message
 * naming the string when it is not one of the forms above. */
int zi_device_parse(const char *device, zi_device_spec *out, zi_error *err);

/* 1 when this build has the CUDA backend. */
int zi_backend_cuda_compiled(void);

/* Creates the backend for `device`. n_threads is the CPU backend's thread
 * count (<= 0: every CPU this process may use); the CUDA backend ignores
 * it. act_bits: the CPU backend's activation precision (zi_cpu_options; 0
 * is its default); a CUDA device refuses 8. Errors name the device string
 * and the problem: unknown string, CUDA not compiled in, no usable CUDA
 * device (with the CUDA runtime's reason), an index beyond the devices
 * present, or the backend's own failure. */
int zi_backend_create_for_device(const char *device, int n_threads, int act_bits, zi_backend **out,
                                 zi_error *err);

/* Writes one line per backend (compiled in or not, what was found) and one
 * per CUDA device, e.g.
 *   cpu: compiled in, kernels avx2, 2 CPUs
 *   cuda: compiled in, 0 devices found (cudaGetDeviceCount: ...)
 *   nccl: compiled in (loaded when tensor parallelism starts)
 */
void zi_backend_list_devices(FILE *out);

#endif
