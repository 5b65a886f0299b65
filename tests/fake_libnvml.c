/* A stand-in for libnvidia-ml.so.1: one GPU, read through the real pynvml, which loads this
 * library as it loads the driver's (dlopen("libnvidia-ml.so.1") on LD_LIBRARY_PATH) and looks
 * each entry point up by name. Only the calls below exist; pynvml reports every other one as
 * NVML_ERROR_FUNCTION_NOT_FOUND, as an old driver would, and the exporter drops those fields.
 *
 * Faults come from outside the exporter, through files in $FAKE_NVML_DIR:
 *   xid   holds an XID code: delivered once as an XID critical-error event on GPU 0;
 *   lost  exists: every device call returns NVML_ERROR_GPU_IS_LOST (fallen off the bus).
 * Built by tests/test_outside_faults.py with `gcc -shared -fPIC`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, INSUFFICIENT_SIZE = 7, TIMEOUT = 10, GPU_IS_LOST = 15 };
#define XID_CRITICAL_ERROR 0x0000000000000008ULL /* nvmlEventTypeXidCriticalError */

struct device { int index; };
static struct device gpu0 = {0};
static int event_set_token;
static int xid_delivered;

typedef struct { struct device *device; unsigned long long eventType, eventData;
                 unsigned gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

static int fault_file(const char *name, char *out, size_t size) {
    const char *dir = getenv("FAKE_NVML_DIR");
    char path[4096];
    if (!dir) return 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (out && size) {
        size_t n = fread(out, 1, size - 1, f);
        out[n] = 0;
    }
    fclose(f);
    return 1;
}

static nvmlReturn_t device_call(struct device *device) {
    if (device != &gpu0) return INVALID_ARGUMENT;
    return fault_file("lost", NULL, 0) ? GPU_IS_LOST : OK;
}

static nvmlReturn_t copy(char *out, unsigned length, const char *text) {
    if (strlen(text) + 1 > length) return INSUFFICIENT_SIZE;
    strcpy(out, text);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case OK: return "Success";
    case TIMEOUT: return "Timeout";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned length) {
    return copy(out, length, "550.54.15");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { *version = 12040; return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) { *count = 1; return OK; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, struct device **device) {
    if (index != 0) return INVALID_ARGUMENT;
    *device = &gpu0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetUUID(struct device *device, char *out, unsigned length) {
    nvmlReturn_t r = device_call(device);
    return r != OK ? r : copy(out, length, "GPU-fa4e11b0-0000-4000-8000-000000000000");
}

nvmlReturn_t nvmlDeviceGetName(struct device *device, char *out, unsigned length) {
    nvmlReturn_t r = device_call(device);
    return r != OK ? r : copy(out, length, "NVIDIA H100 80GB HBM3");
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(struct device *device, nvmlUtilization_t *util) {
    nvmlReturn_t r = device_call(device);
    if (r != OK) return r;
    util->gpu = 93;
    util->memory = 41;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(struct device *device, int sensor, unsigned *celsius) {
    nvmlReturn_t r = device_call(device);
    if (r != OK) return r;
    (void)sensor;
    *celsius = 67;
    return OK;
}

nvmlReturn_t nvmlEventSetCreate(void **set) { *set = &event_set_token; return OK; }
nvmlReturn_t nvmlEventSetFree(void *set) { (void)set; return OK; }

nvmlReturn_t nvmlDeviceRegisterEvents(struct device *device, unsigned long long types,
                                      void *set) {
    (void)types; (void)set;
    return device_call(device);
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    char code[32];
    (void)set;
    if (!xid_delivered && fault_file("xid", code, sizeof code)) {
        xid_delivered = 1;
        memset(data, 0, sizeof *data);
        data->device = &gpu0;
        data->eventType = XID_CRITICAL_ERROR;
        data->eventData = strtoull(code, NULL, 10);
        return OK;
    }
    usleep((timeout_ms < 50 ? timeout_ms : 50) * 1000);
    return TIMEOUT;
}
