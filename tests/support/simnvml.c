/*
 * A simulated NVIDIA Management Library (libnvidia-ml.so.1) for xl's tests.
 *
 * No machine that develops or tests xl has a GPU, so the tests build this file with
 *   gcc -shared -fPIC -O2 -o <dir>/libnvidia-ml.so.1 simnvml.c -lpthread
 * and let the *real* nvidia-ml-py (pynvml) load it through LD_LIBRARY_PATH.
 *
 * Every struct here matches the ctypes layout of nvidia-ml-py 13.615.71 (pynvml.py), which
 * matches the C headers of NVML 12.x/13.x.
 *
 * Configuration: a text file named by $XL_SIMNVML_CONFIG, one "key value" a line. It is re-read
 * whenever its mtime/inode/size changes, so a test can change values while a process runs.
 * Keys (all optional):
 *   driver_version 550.54.15       nvml_version 12.550.54.15     cuda_version 12040
 *   init_error <nvmlReturn_t>      nvmlInit* fails with this code (e.g. 9 = DRIVER_NOT_LOADED)
 *   count <n>                      number of GPUs
 *   gpu.<i>.name / uuid / serial / pci (e.g. 00000000:07:00.0) / pci_device_id (hex, 0x20B210DE)
 *   gpu.<i>.mem_total / mem_used / mem_reserved   bytes (free = total - used - reserved)
 *   gpu.<i>.util_gpu / util_mem    percent
 *   gpu.<i>.util_seq 10,50,90      gpu utilization cycles through these values: one step every
 *   gpu.<i>.util_seq_ms 500        util_seq_ms of wall-clock time (0 = one step per query)
 *   gpu.<i>.temp / fan / pstate / power_mw / power_limit_mw / power_default_limit_mw
 *   gpu.<i>.cc 8.0                 CUDA compute capability
 *   gpu.<i>.mig 0|1  gpu.<i>.mig_pending 0|1   (mig -1: MIG not supported by this GPU)
 *   gpu.<i>.lost 1|2               1: every query of the GPU returns GPU_IS_LOST;
 *                                  2: getting its handle fails with GPU_IS_LOST too
 *   gpu.<i>.errors nvmlDeviceGetTemperature=3,nvmlDeviceGetPowerUsage=3
 *                                  these functions return the given nvmlReturn_t for this GPU
 *   gpu.<i>.compute_mode 0|2|3     nvmlComputeMode_t (0 default, 2 prohibited, 3 exclusive-process)
 *   gpu.<i>.ecc_unc_volatile / ecc_unc_aggregate   uncorrected ECC errors (since the driver
 *                                  loaded / over the GPU's life)
 *   gpu.<i>.remap_corr / remap_unc / remap_pending / remap_failure   nvmlDeviceGetRemappedRows
 *   gpu.<i>.retired_sbe / retired_dbe / retired_pending   retired pages (pre-Ampere ECC)
 *   gpu.<i>.fabric_state -1|0..3   nvmlDeviceGetGpuFabricInfo and ...InfoV (v2, v3): -1
 *                                  NOT_SUPPORTED (no NVSwitch fabric: the default), else
 *                                  nvmlGpuFabricState_t (1 not started, 2 in progress,
 *                                  3 completed)
 *   gpu.<i>.fabric_status N        its status (an nvmlReturn_t; 0 success)
 *                                  (make any of these NOT_SUPPORTED with gpu.<i>.errors)
 *   gpu.<i>.clock_reasons 0x40     nvmlDeviceGetCurrentClocksEventReasons (and the older
 *                                  ...ThrottleReasons): the bitmask of why the clocks are held down
 *   gpu.<i>.sm_clock / sm_clock_max / mem_clock   MHz (current and maximum SM clock, memory clock)
 *   gpu.<i>.xids 13,79             every XID the GPU has had since the driver loaded, oldest first:
 *                                  an event set registered for XIDs gets those listed after it was
 *                                  registered (so a test appends one while a process watches)
 *   gpu.<i>.event_types 0x1f       nvmlDeviceGetSupportedEventTypes (default: ECC, P-state, XID,
 *                                  clock); registering a type outside it is NOT_SUPPORTED
 *   gpu.<i>.procs 1234:1073741824,5678:0     compute processes (pid:used bytes)
 *   gpu.<i>.gprocs ...                        graphics processes
 *
 * Old drivers: compile with -DSIM_NO_<function name> to leave that symbol out, so pynvml's real
 * FunctionNotFound path runs (e.g. -DSIM_NO_nvmlDeviceGetMemoryInfo_v2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_EVENT_XID 0x8ULL
#define MAXXID 64
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

#define MAXGPU 64
#define MAXPROC 128

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    unsigned int pid;
    unsigned long long used;
} sim_proc;

typedef struct sim_gpu {
    int index;
    char name[96];
    char uuid[96];
    char serial[32];
    char pci[32];
    unsigned int pci_device_id;
    unsigned int pci_subsys;
    unsigned long long mem_total, mem_used, mem_reserved;
    unsigned int util_gpu, util_mem;
    unsigned int util_seq[64];
    int util_seq_len;
    unsigned int util_seq_ms;
    int temp;
    unsigned int fan, pstate;
    unsigned int power_mw, power_limit_mw, power_default_limit_mw;
    int cc_major, cc_minor;
    int mig, mig_pending;
    int lost;
    int compute_mode;
    unsigned long long ecc_unc_volatile, ecc_unc_aggregate;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int retired_sbe, retired_dbe, retired_pending;
    int fabric_state, fabric_status;
    unsigned long long clock_reasons;
    unsigned int sm_clock, sm_clock_max, mem_clock;
    unsigned int xids[MAXXID];
    int nxids;
    unsigned long long event_types;
    char errors[1024];
    sim_proc procs[MAXPROC];
    int nprocs;
    sim_proc gprocs[MAXPROC];
    int ngprocs;
} sim_gpu;

typedef sim_gpu *nvmlDevice_t;

/* Layouts as in pynvml.py (and nvml.h). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* pynvml uses the same layout for _v3 */

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_v1_t;
#define nvmlTemperature_v1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1 << 24)))

typedef struct {
    unsigned long long bar1Total;
    unsigned long long bar1Free;
    unsigned long long bar1Used;
} nvmlBAR1Memory_t;

/* ---- state ---------------------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sim_gpu gpus[MAXGPU];
static unsigned long util_calls[MAXGPU]; /* survives reloads: util_seq_ms 0 advances per query */
static int gpu_count;
static int init_error;
static int init_refcount;
static char driver_version[80];
static char nvml_version[80];
static int cuda_version;
static struct stat last_stat;
static int have_stat;

static void set_defaults(void) {
    memset(gpus, 0, sizeof(gpus));
    gpu_count = 0;
    init_error = 0;
    snprintf(driver_version, sizeof(driver_version), "550.54.15");
    snprintf(nvml_version, sizeof(nvml_version), "12.550.54.15");
    cuda_version = 12040;
    for (int i = 0; i < MAXGPU; i++) {
        sim_gpu *g = &gpus[i];
        g->index = i;
        snprintf(g->name, sizeof(g->name), "NVIDIA A100-SXM4-80GB");
        snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-4000-8000-%012x", i);
        snprintf(g->serial, sizeof(g->serial), "13240000%05d", i);
        snprintf(g->pci, sizeof(g->pci), "00000000:%02X:00.0", 0x07 + i);
        g->pci_device_id = 0x20B210DE;
        g->pci_subsys = 0x147F10DE;
        g->mem_total = 85899345920ULL;
        g->temp = 33;
        g->pstate = 0;
        g->power_mw = 60000;
        g->power_limit_mw = 400000;
        g->power_default_limit_mw = 400000;
        g->cc_major = 8;
        g->cc_minor = 0;
        g->fabric_state = -1;
        g->sm_clock = 1410;
        g->sm_clock_max = 1410;
        g->mem_clock = 1593;
        g->event_types = 0x1fULL;
    }
}

static void parse_xids(const char *v, sim_gpu *g) {
    g->nxids = 0;
    const char *p = v;
    while (*p && g->nxids < MAXXID) {
        char *end;
        unsigned long x = strtoul(p, &end, 10);
        if (end == p) break;
        g->xids[g->nxids++] = (unsigned int)x;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
}

static void parse_procs(const char *v, sim_proc *out, int *n) {
    *n = 0;
    const char *p = v;
    while (*p && *n < MAXPROC) {
        char *end;
        unsigned long pid = strtoul(p, &end, 10);
        if (end == p) break;
        unsigned long long used = 0;
        if (*end == ':') used = strtoull(end + 1, &end, 10);
        out[*n].pid = (unsigned int)pid;
        out[*n].used = used;
        (*n)++;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
}

static void parse_seq(const char *v, sim_gpu *g) {
    g->util_seq_len = 0;
    const char *p = v;
    while (*p && g->util_seq_len < 64) {
        char *end;
        unsigned long x = strtoul(p, &end, 10);
        if (end == p) break;
        g->util_seq[g->util_seq_len++] = (unsigned int)x;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
}

static void set_gpu_key(sim_gpu *g, const char *k, const char *v) {
#define STR(field) snprintf(g->field, sizeof(g->field), "%s", v)
    if (!strcmp(k, "name")) STR(name);
    else if (!strcmp(k, "uuid")) STR(uuid);
    else if (!strcmp(k, "serial")) STR(serial);
    else if (!strcmp(k, "pci")) STR(pci);
    else if (!strcmp(k, "pci_device_id")) g->pci_device_id = (unsigned int)strtoul(v, NULL, 0);
    else if (!strcmp(k, "mem_total")) g->mem_total = strtoull(v, NULL, 10);
    else if (!strcmp(k, "mem_used")) g->mem_used = strtoull(v, NULL, 10);
    else if (!strcmp(k, "mem_reserved")) g->mem_reserved = strtoull(v, NULL, 10);
    else if (!strcmp(k, "util_gpu")) g->util_gpu = (unsigned int)atoi(v);
    else if (!strcmp(k, "util_mem")) g->util_mem = (unsigned int)atoi(v);
    else if (!strcmp(k, "util_seq")) parse_seq(v, g);
    else if (!strcmp(k, "util_seq_ms")) g->util_seq_ms = (unsigned int)atoi(v);
    else if (!strcmp(k, "temp")) g->temp = atoi(v);
    else if (!strcmp(k, "fan")) g->fan = (unsigned int)atoi(v);
    else if (!strcmp(k, "pstate")) g->pstate = (unsigned int)atoi(v);
    else if (!strcmp(k, "power_mw")) g->power_mw = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "power_limit_mw")) g->power_limit_mw = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "power_default_limit_mw"))
        g->power_default_limit_mw = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "cc")) {
        g->cc_major = atoi(v);
        const char *dot = strchr(v, '.');
        g->cc_minor = dot ? atoi(dot + 1) : 0;
    } else if (!strcmp(k, "mig")) g->mig = atoi(v);
    else if (!strcmp(k, "mig_pending")) g->mig_pending = atoi(v);
    else if (!strcmp(k, "lost")) g->lost = atoi(v);
    else if (!strcmp(k, "compute_mode")) g->compute_mode = atoi(v);
    else if (!strcmp(k, "ecc_unc_volatile")) g->ecc_unc_volatile = strtoull(v, NULL, 10);
    else if (!strcmp(k, "ecc_unc_aggregate")) g->ecc_unc_aggregate = strtoull(v, NULL, 10);
    else if (!strcmp(k, "remap_corr")) g->remap_corr = (unsigned int)atoi(v);
    else if (!strcmp(k, "remap_unc")) g->remap_unc = (unsigned int)atoi(v);
    else if (!strcmp(k, "remap_pending")) g->remap_pending = (unsigned int)atoi(v);
    else if (!strcmp(k, "remap_failure")) g->remap_failure = (unsigned int)atoi(v);
    else if (!strcmp(k, "retired_sbe")) g->retired_sbe = (unsigned int)atoi(v);
    else if (!strcmp(k, "retired_dbe")) g->retired_dbe = (unsigned int)atoi(v);
    else if (!strcmp(k, "retired_pending")) g->retired_pending = (unsigned int)atoi(v);
    else if (!strcmp(k, "fabric_state")) g->fabric_state = atoi(v);
    else if (!strcmp(k, "fabric_status")) g->fabric_status = atoi(v);
    else if (!strcmp(k, "clock_reasons")) g->clock_reasons = strtoull(v, NULL, 0);
    else if (!strcmp(k, "sm_clock")) g->sm_clock = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "sm_clock_max")) g->sm_clock_max = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "mem_clock")) g->mem_clock = (unsigned int)strtoul(v, NULL, 10);
    else if (!strcmp(k, "xids")) parse_xids(v, g);
    else if (!strcmp(k, "event_types")) g->event_types = strtoull(v, NULL, 0);
    else if (!strcmp(k, "errors")) snprintf(g->errors, sizeof(g->errors), ",%s,", v);
    else if (!strcmp(k, "procs")) parse_procs(v, g->procs, &g->nprocs);
    else if (!strcmp(k, "gprocs")) parse_procs(v, g->gprocs, &g->ngprocs);
#undef STR
}

/* Called with the lock held at the start of every entry point. */
static void reload_if_changed(void) {
    const char *path = getenv("XL_SIMNVML_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (!have_stat) {
            set_defaults();
            have_stat = 1;
            memset(&last_stat, 0, sizeof(last_stat));
        }
        return;
    }
    if (have_stat && st.st_ino == last_stat.st_ino && st.st_size == last_stat.st_size &&
        st.st_mtim.tv_sec == last_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == last_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    set_defaults();
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        char *sp = strchr(line, ' ');
        const char *val = "";
        if (sp) {
            *sp = 0;
            val = sp + 1;
        }
        if (!strcmp(line, "driver_version")) snprintf(driver_version, sizeof(driver_version), "%s", val);
        else if (!strcmp(line, "nvml_version")) snprintf(nvml_version, sizeof(nvml_version), "%s", val);
        else if (!strcmp(line, "cuda_version")) cuda_version = atoi(val);
        else if (!strcmp(line, "init_error")) init_error = atoi(val);
        else if (!strcmp(line, "count")) {
            gpu_count = atoi(val);
            if (gpu_count < 0) gpu_count = 0;
            if (gpu_count > MAXGPU) gpu_count = MAXGPU;
        } else if (!strncmp(line, "gpu.", 4)) {
            char *end;
            long i = strtol(line + 4, &end, 10);
            if (*end == '.' && i >= 0 && i < MAXGPU) set_gpu_key(&gpus[i], end + 1, val);
        }
    }
    fclose(f);
    last_stat = st;
    have_stat = 1;
}

static nvmlReturn_t configured_error(const sim_gpu *g, const char *fname) {
    if (!g->errors[0]) return NVML_SUCCESS;
    char needle[160];
    snprintf(needle, sizeof(needle), ",%s=", fname);
    const char *p = strstr(g->errors, needle);
    return p ? atoi(p + strlen(needle)) : NVML_SUCCESS;
}

static nvmlReturn_t enter(void) {
    pthread_mutex_lock(&lock);
    reload_if_changed();
    return init_refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static nvmlReturn_t enter_dev(nvmlDevice_t device, const char *fname) {
    nvmlReturn_t rc = enter();
    if (rc) return rc;
    if (device < gpus || device >= gpus + MAXGPU || device->index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->lost) return NVML_ERROR_GPU_IS_LOST;
    return configured_error(device, fname);
}

#define LEAVE(rc)                        \
    do {                                 \
        nvmlReturn_t _r = (rc);          \
        pthread_mutex_unlock(&lock);     \
        return _r;                       \
    } while (0)

#define DEV_ENTER(fname)                                   \
    nvmlReturn_t _rc = enter_dev(device, fname);           \
    if (_rc) LEAVE(_rc);                                   \
    sim_gpu *g = device;                                   \
    (void)g

static int copy_str(char *dst, unsigned int len, const char *src) {
    size_t n = strlen(src);
    if (!dst || len <= n) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* ---- init / system ------------------------------------------------------------------- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    reload_if_changed();
    if (init_error) LEAVE(init_error);
    init_refcount++;
    LEAVE(NVML_SUCCESS);
}

#ifndef SIM_NO_nvmlInit
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
#endif
#ifndef SIM_NO_nvmlInit_v2
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
#endif
#ifndef SIM_NO_nvmlInitWithFlags
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}
#endif

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (init_refcount <= 0) LEAVE(NVML_ERROR_UNINITIALIZED);
    init_refcount--;
    LEAVE(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

#ifndef SIM_NO_nvmlSystemGetDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    LEAVE(copy_str(version, length, driver_version));
}
#endif

#ifndef SIM_NO_nvmlSystemGetNVMLVersion
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    /* Works without init, as in NVML. */
    pthread_mutex_lock(&lock);
    reload_if_changed();
    LEAVE(copy_str(version, length, nvml_version));
}
#endif

static nvmlReturn_t get_cuda_version(int *v) {
    /* Works without init, as in NVML (it asks the CUDA driver). */
    pthread_mutex_lock(&lock);
    reload_if_changed();
    if (!v) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *v = cuda_version;
    LEAVE(NVML_SUCCESS);
}

#ifndef SIM_NO_nvmlSystemGetCudaDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return get_cuda_version(v); }
#endif
#ifndef SIM_NO_nvmlSystemGetCudaDriverVersion_v2
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return get_cuda_version(v); }
#endif

#ifndef SIM_NO_nvmlSystemGetProcessName
EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    char path[64], buf[256] = {0};
    snprintf(path, sizeof(path), "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) LEAVE(NVML_ERROR_NOT_FOUND);
    if (!fgets(buf, sizeof(buf), f)) buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    LEAVE(copy_str(name, length, buf));
}
#endif

/* ---- device handles ------------------------------------------------------------------ */

static nvmlReturn_t get_count(unsigned int *count) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)gpu_count;
    LEAVE(NVML_SUCCESS);
}

#ifndef SIM_NO_nvmlDeviceGetCount
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return get_count(count); }
#endif
#ifndef SIM_NO_nvmlDeviceGetCount_v2
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return get_count(count); }
#endif

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!device || index >= (unsigned int)gpu_count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (gpus[index].lost >= 2) LEAVE(NVML_ERROR_GPU_IS_LOST);
    *device = &gpus[index];
    LEAVE(NVML_SUCCESS);
}

#ifndef SIM_NO_nvmlDeviceGetHandleByIndex
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return handle_by_index(i, d);
}
#endif
#ifndef SIM_NO_nvmlDeviceGetHandleByIndex_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    return handle_by_index(i, d);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetHandleByUUID
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!uuid || !device) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < gpu_count; i++) {
        if (!strcmp(gpus[i].uuid, uuid)) {
            if (gpus[i].lost >= 2) LEAVE(NVML_ERROR_GPU_IS_LOST);
            *device = &gpus[i];
            LEAVE(NVML_SUCCESS);
        }
    }
    LEAVE(NVML_ERROR_NOT_FOUND);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetHandleByPciBusId_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!bus || !device) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < gpu_count; i++) {
        if (!strcasecmp(gpus[i].pci, bus) || !strcasecmp(gpus[i].pci + 4, bus)) {
            *device = &gpus[i];
            LEAVE(NVML_SUCCESS);
        }
    }
    LEAVE(NVML_ERROR_NOT_FOUND);
}
#endif

/* ---- device queries ------------------------------------------------------------------ */

#ifndef SIM_NO_nvmlDeviceGetIndex
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER("nvmlDeviceGetIndex");
    *index = (unsigned int)g->index;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetMinorNumber
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_ENTER("nvmlDeviceGetMinorNumber");
    *minor = (unsigned int)g->index;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetName
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetName");
    LEAVE(copy_str(name, length, g->name));
}
#endif

#ifndef SIM_NO_nvmlDeviceGetUUID
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetUUID");
    LEAVE(copy_str(uuid, length, g->uuid));
}
#endif

#ifndef SIM_NO_nvmlDeviceGetSerial
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetSerial");
    LEAVE(copy_str(serial, length, g->serial));
}
#endif

static void fill_pci(const sim_gpu *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof(*pci));
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->pci, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsys;
    snprintf(pci->busId, sizeof(pci->busId), "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xFFFF, bus,
             dev, fn);
}

#ifndef SIM_NO_nvmlDeviceGetPciInfo
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfo");
    fill_pci(g, pci);
    LEAVE(NVML_SUCCESS);
}
#endif
#ifndef SIM_NO_nvmlDeviceGetPciInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfo_v2");
    fill_pci(g, pci);
    LEAVE(NVML_SUCCESS);
}
#endif
#ifndef SIM_NO_nvmlDeviceGetPciInfo_v3
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfo_v3");
    fill_pci(g, pci);
    LEAVE(NVML_SUCCESS);
}
#endif

static unsigned long long mem_free(const sim_gpu *g) {
    unsigned long long taken = g->mem_used + g->mem_reserved;
    return taken >= g->mem_total ? 0 : g->mem_total - taken;
}

#ifndef SIM_NO_nvmlDeviceGetMemoryInfo
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo");
    if (!m) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    /* v1 counts the driver's reserved memory as used. */
    m->total = g->mem_total;
    m->free = mem_free(g);
    m->used = g->mem_total - m->free;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetMemoryInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo_v2");
    if (!m) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (m->version != nvmlMemory_v2) LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    m->total = g->mem_total;
    m->reserved = g->mem_reserved;
    m->free = mem_free(g);
    m->used = g->mem_used;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetBAR1MemoryInfo
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *m) {
    DEV_ENTER("nvmlDeviceGetBAR1MemoryInfo");
    m->bar1Total = 128ULL << 30;
    m->bar1Used = 2ULL << 20;
    m->bar1Free = m->bar1Total - m->bar1Used;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetUtilizationRates
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_ENTER("nvmlDeviceGetUtilizationRates");
    if (!u) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int gpu = g->util_gpu;
    if (g->util_seq_len > 0) {
        unsigned long step;
        if (g->util_seq_ms > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            unsigned long long ms = (unsigned long long)ts.tv_sec * 1000ULL + ts.tv_nsec / 1000000;
            step = (unsigned long)(ms / g->util_seq_ms);
        } else {
            step = util_calls[g->index]++;
        }
        gpu = g->util_seq[step % (unsigned long)g->util_seq_len];
    }
    u->gpu = gpu;
    u->memory = g->util_mem;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetEncoderUtilization
EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util,
                                                    unsigned int *period) {
    DEV_ENTER("nvmlDeviceGetEncoderUtilization");
    *util = 0;
    *period = 167000;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetDecoderUtilization
EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util,
                                                    unsigned int *period) {
    DEV_ENTER("nvmlDeviceGetDecoderUtilization");
    *util = 0;
    *period = 167000;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetTemperature
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *t) {
    DEV_ENTER("nvmlDeviceGetTemperature");
    if (sensor != 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *t = (unsigned int)g->temp;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetTemperatureV
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *t) {
    DEV_ENTER("nvmlDeviceGetTemperatureV");
    if (!t) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (t->version != nvmlTemperature_v1) LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (t->sensorType != 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    t->temperature = g->temp;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetFanSpeed
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEV_ENTER("nvmlDeviceGetFanSpeed");
    *speed = g->fan;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetPerformanceState
EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *p) {
    DEV_ENTER("nvmlDeviceGetPerformanceState");
    *p = g->pstate;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetPowerUsage
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetPowerUsage");
    *mw = g->power_mw;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetEnforcedPowerLimit
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetEnforcedPowerLimit");
    *mw = g->power_limit_mw;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetPowerManagementLimit
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetPowerManagementLimit");
    *mw = g->power_limit_mw;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetPowerManagementDefaultLimit
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                             unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetPowerManagementDefaultLimit");
    *mw = g->power_default_limit_mw;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetCudaComputeCapability
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                       int *minor) {
    DEV_ENTER("nvmlDeviceGetCudaComputeCapability");
    *major = g->cc_major;
    *minor = g->cc_minor;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetMigMode
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                         unsigned int *pending) {
    DEV_ENTER("nvmlDeviceGetMigMode");
    if (g->mig < 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)g->mig;
    *pending = (unsigned int)g->mig_pending;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetPersistenceMode
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    DEV_ENTER("nvmlDeviceGetPersistenceMode");
    *mode = 1;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetDisplayMode
EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, int *mode) {
    DEV_ENTER("nvmlDeviceGetDisplayMode");
    *mode = 0;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetDisplayActive
EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, int *mode) {
    DEV_ENTER("nvmlDeviceGetDisplayActive");
    *mode = 0;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetComputeMode
EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode) {
    DEV_ENTER("nvmlDeviceGetComputeMode");
    *mode = g->compute_mode;
    LEAVE(NVML_SUCCESS);
}
#endif

/* ---- health: ECC, row remapping, page retirement ------------------------------------- */

#ifndef SIM_NO_nvmlDeviceGetEccMode
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    DEV_ENTER("nvmlDeviceGetEccMode");
    *current = 1;
    *pending = 1;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetTotalEccErrors
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type,
                                                int counter_type, unsigned long long *count) {
    DEV_ENTER("nvmlDeviceGetTotalEccErrors");
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    /* error_type 1 = uncorrected (corrected ones are counted as 0 here); counter 0 = volatile */
    if (error_type != 1) *count = 0;
    else *count = counter_type == 0 ? g->ecc_unc_volatile : g->ecc_unc_aggregate;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetRemappedRows
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr,
                                              unsigned int *unc, unsigned int *pending,
                                              unsigned int *failure) {
    DEV_ENTER("nvmlDeviceGetRemappedRows");
    if (!corr || !unc || !pending || !failure) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetGpuFabricInfo
/* nvml.h's nvmlGpuFabricInfo_t */
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} sim_fabric_info;

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, sim_fabric_info *info) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfo");
    if (!info) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (g->fabric_state < 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof(*info));
    info->status = g->fabric_status;
    info->state = (unsigned int)g->fabric_state;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetGpuFabricInfoV
/* nvml.h's nvmlGpuFabricInfo_v2_t and _v3_t (v3 adds healthSummary). nvmlGpuFabricState_t is one
 * byte there, and NVML leaves the padding after it as it was: here 0xAB, so a reader that takes
 * the state as four bytes reads garbage, as it would from a real driver. */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary;
} sim_fabric_info_v3;
#define SIM_FABRIC_V2 0x02000024u
#define SIM_FABRIC_V3 0x03000028u

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, sim_fabric_info_v3 *info) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfoV");
    if (!info) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int v = info->version;
    if (v != SIM_FABRIC_V2 && v != SIM_FABRIC_V3) LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->fabric_state < 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    memset((char *)info + sizeof(info->version), 0xAB, (v & 0xffffffu) - sizeof(info->version));
    memset(info->clusterUuid, 0, sizeof(info->clusterUuid));
    info->status = g->fabric_status;
    info->cliqueId = 0;
    info->state = (unsigned char)g->fabric_state;
    info->healthMask = 0;
    if (v == SIM_FABRIC_V3) info->healthSummary = 0;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetRetiredPages
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    DEV_ENTER("nvmlDeviceGetRetiredPages");
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = cause == 1 ? g->retired_dbe : g->retired_sbe; /* 1 = double bit ECC */
    if (*count < n) {
        *count = n;
        LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *count = n;
    for (unsigned int i = 0; i < n && addresses; i++) addresses[i] = 0x1000ULL * (i + 1);
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetRetiredPagesPendingStatus
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    DEV_ENTER("nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = (int)g->retired_pending;
    LEAVE(NVML_SUCCESS);
}
#endif

/* ---- clocks and what holds them down ------------------------------------------------ */

/* nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video */
static unsigned int clock_of(const sim_gpu *g, int type, int max) {
    if (type == 2) return g->mem_clock;
    return max ? g->sm_clock_max : g->sm_clock;
}

#ifndef SIM_NO_nvmlDeviceGetClockInfo
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    DEV_ENTER("nvmlDeviceGetClockInfo");
    if (!mhz) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *mhz = clock_of(g, type, 0);
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetMaxClockInfo
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    DEV_ENTER("nvmlDeviceGetMaxClockInfo");
    if (!mhz) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *mhz = clock_of(g, type, 1);
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetCurrentClocksEventReasons
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    DEV_ENTER("nvmlDeviceGetCurrentClocksEventReasons");
    if (!reasons) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clock_reasons;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetCurrentClocksThrottleReasons
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    DEV_ENTER("nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!reasons) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clock_reasons;
    LEAVE(NVML_SUCCESS);
}
#endif

/* ---- events: XIDs --------------------------------------------------------------------- */

/* As in nvml.h (and pynvml's c_nvmlEventData_t). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    int n;
    struct {
        int index;    /* the GPU's index: its sim_gpu is rewritten on every reload */
        int seen;     /* how many of its XIDs were there before, or have been delivered */
    } reg[MAXGPU];
} sim_event_set;

#ifndef SIM_NO_nvmlEventSetCreate
EXPORT nvmlReturn_t nvmlEventSetCreate(sim_event_set **set) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!set) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof(sim_event_set));
    LEAVE(*set ? NVML_SUCCESS : 20);
}
#endif

#ifndef SIM_NO_nvmlEventSetFree
EXPORT nvmlReturn_t nvmlEventSetFree(sim_event_set *set) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    free(set);
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceGetSupportedEventTypes
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *types) {
    DEV_ENTER("nvmlDeviceGetSupportedEventTypes");
    if (!types) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *types = g->event_types;
    LEAVE(NVML_SUCCESS);
}
#endif

#ifndef SIM_NO_nvmlDeviceRegisterEvents
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             sim_event_set *set) {
    DEV_ENTER("nvmlDeviceRegisterEvents");
    if (!set) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~g->event_types) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (!(types & NVML_EVENT_XID)) LEAVE(NVML_SUCCESS);
    for (int i = 0; i < set->n; i++)
        if (set->reg[i].index == g->index) LEAVE(NVML_SUCCESS);
    if (set->n >= MAXGPU) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    set->reg[set->n].index = g->index;
    set->reg[set->n].seen = g->nxids; /* only XIDs from now on, as the driver delivers them */
    set->n++;
    LEAVE(NVML_SUCCESS);
}
#endif

static int next_xid(sim_event_set *set, nvmlEventData_t *data) {
    for (int i = 0; i < set->n; i++) {
        sim_gpu *g = &gpus[set->reg[i].index];
        if (set->reg[i].seen > g->nxids) set->reg[i].seen = g->nxids; /* the list was rewritten */
        if (set->reg[i].seen < g->nxids) {
            memset(data, 0, sizeof(*data));
            data->device = g;
            data->eventType = NVML_EVENT_XID;
            data->eventData = g->xids[set->reg[i].seen++];
            data->gpuInstanceId = 0xFFFFFFFF;
            data->computeInstanceId = 0xFFFFFFFF;
            return 1;
        }
    }
    return 0;
}

static nvmlReturn_t event_wait(sim_event_set *set, nvmlEventData_t *data, unsigned int ms) {
    nvmlReturn_t rc = enter();
    if (rc) LEAVE(rc);
    if (!set || !data) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (next_xid(set, data)) LEAVE(NVML_SUCCESS);
    if (ms == 0) LEAVE(NVML_ERROR_TIMEOUT);
    pthread_mutex_unlock(&lock);
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&lock);
    reload_if_changed();
    LEAVE(next_xid(set, data) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT);
}

#ifndef SIM_NO_nvmlEventSetWait_v2
EXPORT nvmlReturn_t nvmlEventSetWait_v2(sim_event_set *set, nvmlEventData_t *data,
                                        unsigned int timeoutms) {
    return event_wait(set, data, timeoutms);
}
#endif
#ifndef SIM_NO_nvmlEventSetWait
EXPORT nvmlReturn_t nvmlEventSetWait(sim_event_set *set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    return event_wait(set, data, timeoutms);
}
#endif

/* ---- processes ----------------------------------------------------------------------- */

static nvmlReturn_t list_procs(const sim_proc *src, int n, unsigned int *count, void *out,
                               int v1) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = (unsigned int)n;
    if (n == 0) return NVML_SUCCESS;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)out + i;
            p->pid = src[i].pid;
            p->usedGpuMemory = src[i].used;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)out + i;
            p->pid = src[i].pid;
            p->usedGpuMemory = src[i].used;
            p->gpuInstanceId = 0xFFFFFFFF;
            p->computeInstanceId = 0xFFFFFFFF;
        }
    }
    return NVML_SUCCESS;
}

#define PROC_FN(fname, list, n, v1)                                                     \
    EXPORT nvmlReturn_t fname(nvmlDevice_t device, unsigned int *count, void *infos) {  \
        DEV_ENTER(#fname);                                                              \
        LEAVE(list_procs(g->list, g->n, count, infos, v1));                             \
    }

#ifndef SIM_NO_nvmlDeviceGetComputeRunningProcesses
PROC_FN(nvmlDeviceGetComputeRunningProcesses, procs, nprocs, 1)
#endif
#ifndef SIM_NO_nvmlDeviceGetComputeRunningProcesses_v2
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v2, procs, nprocs, 0)
#endif
#ifndef SIM_NO_nvmlDeviceGetComputeRunningProcesses_v3
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v3, procs, nprocs, 0)
#endif
#ifndef SIM_NO_nvmlDeviceGetGraphicsRunningProcesses
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses, gprocs, ngprocs, 1)
#endif
#ifndef SIM_NO_nvmlDeviceGetGraphicsRunningProcesses_v2
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, gprocs, ngprocs, 0)
#endif
#ifndef SIM_NO_nvmlDeviceGetGraphicsRunningProcesses_v3
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, gprocs, ngprocs, 0)
#endif

/* ---- for the tests: the layouts this file uses, to compare with pynvml's ctypes ---------- */

EXPORT size_t simnvml_sizeof(const char *name) {
    if (!strcmp(name, "nvmlPciInfo_t")) return sizeof(nvmlPciInfo_t);
    if (!strcmp(name, "nvmlMemory_t")) return sizeof(nvmlMemory_t);
    if (!strcmp(name, "nvmlMemory_v2_t")) return sizeof(nvmlMemory_v2_t);
    if (!strcmp(name, "nvmlUtilization_t")) return sizeof(nvmlUtilization_t);
    if (!strcmp(name, "nvmlProcessInfo_v2_t")) return sizeof(nvmlProcessInfo_v2_t);
    if (!strcmp(name, "nvmlTemperature_v1_t")) return sizeof(nvmlTemperature_v1_t);
    if (!strcmp(name, "nvmlBAR1Memory_t")) return sizeof(nvmlBAR1Memory_t);
    if (!strcmp(name, "nvmlEventData_t")) return sizeof(nvmlEventData_t);
    return 0;
}
