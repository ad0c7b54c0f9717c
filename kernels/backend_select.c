/*
 * backend_select.c - see backend_select.h. The only file outside
 * kernels/cuda/ that knows whether CUDA was compiled in (ZI_HAVE_CUDA), so
 * the binaries can offer --device without #ifdefs of their own.
 */
#include "backend_select.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "tp.h"
#ifdef ZI_HAVE_CUDA
#include "cuda_backend.h"
#endif

#define ZI_DEVICE_FORMS "expected cpu, cuda or cuda:N"

int zi_device_parse(const char *device, zi_device_spec *out, zi_error *err) {
    zi_device_spec spec = {ZI_DEVICE_CPU, 0};
    if (!device || !strcmp(device, "cpu")) {
        *out = spec;
        return ZI_OK;
    }
    if (!strncmp(device, "cuda", 4) && (device[4] == '\0' || device[4] == ':')) {
        spec.kind = ZI_DEVICE_CUDA;
        if (device[4] == ':') {
            const char *p = device + 5;
            if (!*p)
                return zi_error_set(err, ZI_EINVAL,
                                    "device 'cuda:' has no device number (" ZI_DEVICE_FORMS ")");
            long v = 0;
            for (; *p; p++) {
                if (*p < '0' || *p > '9')
                    return zi_error_set(err, ZI_EINVAL,
                                        "device '%.64s': '%.64s' is not a device number "
                                        "(" ZI_DEVICE_FORMS ")",
                                        device, device + 5);
                v = v * 10 + (*p - '0');
                if (v > ZI_DEVICE_INDEX_MAX)
                    return zi_error_set(err, ZI_EINVAL, "device '%.64s': device number is above %d",
                                        device, ZI_DEVICE_INDEX_MAX);
            }
            spec.index = (int)v;
        }
        *out = spec;
        return ZI_OK;
    }
    if (!*device) return zi_error_set(err, ZI_EINVAL, "empty device name (" ZI_DEVICE_FORMS ")");
    return zi_error_set(err, ZI_EINVAL, "unknown device '%.64s' (" ZI_DEVICE_FORMS ")", device);
}

int zi_backend_cuda_compiled(void) {
#ifdef ZI_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int zi_backend_create_for_device(const char *device, int n_threads, int act_bits, zi_backend **out,
                                 zi_error *err) {
    zi_device_spec spec;
    int rc = zi_device_parse(device, &spec, err);
    if (rc) return rc;
    if (spec.kind == ZI_DEVICE_CPU) {
        zi_cpu_options o = {.n_threads = n_threads, .act_bits = act_bits};
        return zi_cpu_backend_create(&o, out, err);
    }
    if (act_bits && act_bits != 16)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "device '%.64s': --act-bits %d is a CPU option (the CUDA backend "
                            "keeps its own precision)",
                            device, act_bits);
#ifdef ZI_HAVE_CUDA
    int count = 0;
    if ((rc = zi_cuda_device_count(&count, err))) {
        zi_error_prefix(err, "device '%.64s': no usable CUDA device", device);
        return rc;
    }
    if (spec.index >= count)
        return zi_error_set(err, ZI_EINVAL,
                            "device '%.64s': this machine has %d CUDA device%s (cuda:0..cuda:%d)",
                            device, count, count == 1 ? "" : "s", count - 1);
    zi_cuda_options o = {.device = spec.index};
    if ((rc = zi_cuda_backend_create(&o, out, err))) zi_error_prefix(err, "device '%.64s'", device);
    return rc;
#else
    return zi_error_set(err, ZI_EUNSUPPORTED,
                        "device '%.64s': this zinfer was built without CUDA (nvcc was not on PATH "
                        "when meson configured the build; see docs/cuda.md)",
                        device);
#endif
}

static int cpu_count(void) {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                        : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

void zi_backend_list_devices(FILE *out) {
    const zi_cpu_kernels *k = zi_cpu_kernels_select();
    int n = cpu_count();
    fprintf(out, "cpu: compiled in, kernels %s, %d CPU%s\n", k ? k->isa : "unavailable", n,
            n == 1 ? "" : "s");
#ifdef ZI_HAVE_CUDA
    int count = 0;
    zi_error err = {0};
    if (zi_cuda_device_count(&count, &err)) {
        fprintf(out, "cuda: compiled in, 0 devices found (%s)\n", err.msg);
    } else {
        fprintf(out, "cuda: compiled in, %d device%s found\n", count, count == 1 ? "" : "s");
        for (int i = 0; i < count; i++) {
            char name[ZI_ERROR_MSG_MAX + 8];
            if (zi_cuda_device_name(i, name, sizeof name, &err))
                snprintf(name, sizeof name, "(%s)", err.msg);
            fprintf(out, "  cuda:%d  %s\n", i, name);
        }
    }
#else
    fprintf(out, "cuda: not compiled in (nvcc was not on PATH when the build was configured)\n");
#endif
    if (zi_tp_nccl_compiled())
        fprintf(out, "nccl: compiled in (loaded when tensor parallelism starts)\n");
    else
        fprintf(out, "nccl: not compiled in (nccl.h or libnccl not found at configure time)\n");
}
