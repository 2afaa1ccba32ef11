/*
 * A stand-in libnvidia-ml.so.1 for tests: it exports the NVML symbols that pynvml (nvidia-ml-py) calls
 * for the node agent's GPU source, with the real C signatures, so the real pynvml code path runs.
 *
 * Build:  gcc -shared -fPIC -O1 -o libnvidia-ml.so.1 nvml_stub.c -lpthread
 * (deliberately without -Wl,-soname: a later dlopen("libnvidia-ml.so.1") by bare name must not match
 * this stub once it is loaded from an explicit path, so "no NVIDIA driver" stays testable in-process).
 *
 * State comes from the text file named by $NVML_STUB_STATE, re-read whenever its inode, size or mtime
 * changes (tests write it atomically: write a temp file, then rename). One line per GPU, key=value pairs:
 *
 *   gpu=0 uuid=GPU-0000 temp=65 power_mw=250000 sm=1410 mem=1593 util=87 memutil=40 mem_used=123456789
 *         mem_total=85899345920 throttle=0x20 ecc_corr=3 ecc_unc=0 retired_sbe=1 retired_dbe=0
 *         remap_corr=0 remap_unc=0 remap_pending=0 remap_failed=0 pcie_replay=5 nvlinks=4
 *         nvlink_replay=0,1,0,0 nvlink_recovery=0,0,0,0 nvlink_crc_flit=0,0,2,0 nvlink_crc_data=0,0,0,0
 *         lost=0 xid=79 xid_seq=1 unsupported=power,ecc
 *
 * Lines starting with '#' are comments; the number of GPUs is the number of gpu= lines (in order).
 * `lost=1`: every call on that GPU returns NVML_ERROR_GPU_IS_LOST (15).
 * XID: an event with eventData=`xid` is delivered through nvmlEventSetWait_v2 to every event set that
 * registered nvmlEventTypeXidCriticalError on the GPU, once each time `xid_seq` rises above the value it
 * had when the set registered (like real NVML, only errors after registration are delivered).
 * `unsupported=`: comma-separated field names (temp, power, clock, util, memory, throttle, ecc, retired,
 * remap, pcie, nvlink, events) whose calls return NVML_ERROR_NOT_SUPPORTED; `fail=`: the same, returning
 * NVML_ERROR_UNKNOWN (999) instead, an unexpected error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_LINKS 36
#define XID_EVENT 0x8ULL
#define MEMORY_V2 0x02000028u

typedef struct {
    char uuid[96];
    unsigned temp, power_mw, sm, mem, util, memutil;
    unsigned long long mem_used, mem_total, throttle, ecc_corr, ecc_unc;
    unsigned retired_sbe, retired_dbe, remap_corr, remap_unc, remap_pending, remap_failed, pcie_replay;
    unsigned nvlinks;
    unsigned long long nvlink[4][MAX_LINKS]; /* replay, recovery, crc_flit, crc_data */
    int lost;
    unsigned long long xid, xid_seq;
    char unsupported[256];
    char fail[256];
} gpu_t;

/* Handles point at these; they are never dereferenced by the caller. */
typedef struct { int index; } device_t;
static device_t devices[MAX_GPUS];

typedef struct {
    unsigned long long mask[MAX_GPUS];
    unsigned long long seen_seq[MAX_GPUS];
} event_set_t;

typedef struct {
    device_t *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
} nvmlEventData_t;

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static gpu_t gpus[MAX_GPUS];
static int ngpus;
static int init_count;
static struct stat last_stat;
static int have_stat;

static void parse_list(const char *v, unsigned long long *out) {
    for (int i = 0; i < MAX_LINKS && *v; i++) {
        out[i] = strtoull(v, (char **)&v, 0);
        if (*v == ',') v++; else break;
    }
}

static void parse_pair(gpu_t *g, const char *k, const char *v) {
    unsigned long long n = strtoull(v, NULL, 0);
    if (!strcmp(k, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", v);
    else if (!strcmp(k, "temp")) g->temp = n;
    else if (!strcmp(k, "power_mw")) g->power_mw = n;
    else if (!strcmp(k, "sm")) g->sm = n;
    else if (!strcmp(k, "mem")) g->mem = n;
    else if (!strcmp(k, "util")) g->util = n;
    else if (!strcmp(k, "memutil")) g->memutil = n;
    else if (!strcmp(k, "mem_used")) g->mem_used = n;
    else if (!strcmp(k, "mem_total")) g->mem_total = n;
    else if (!strcmp(k, "throttle")) g->throttle = n;
    else if (!strcmp(k, "ecc_corr")) g->ecc_corr = n;
    else if (!strcmp(k, "ecc_unc")) g->ecc_unc = n;
    else if (!strcmp(k, "retired_sbe")) g->retired_sbe = n;
    else if (!strcmp(k, "retired_dbe")) g->retired_dbe = n;
    else if (!strcmp(k, "remap_corr")) g->remap_corr = n;
    else if (!strcmp(k, "remap_unc")) g->remap_unc = n;
    else if (!strcmp(k, "remap_pending")) g->remap_pending = n;
    else if (!strcmp(k, "remap_failed")) g->remap_failed = n;
    else if (!strcmp(k, "pcie_replay")) g->pcie_replay = n;
    else if (!strcmp(k, "nvlinks")) g->nvlinks = n > MAX_LINKS ? MAX_LINKS : n;
    else if (!strcmp(k, "nvlink_replay")) parse_list(v, g->nvlink[0]);
    else if (!strcmp(k, "nvlink_recovery")) parse_list(v, g->nvlink[1]);
    else if (!strcmp(k, "nvlink_crc_flit")) parse_list(v, g->nvlink[2]);
    else if (!strcmp(k, "nvlink_crc_data")) parse_list(v, g->nvlink[3]);
    else if (!strcmp(k, "lost")) g->lost = (int)n;
    else if (!strcmp(k, "xid")) g->xid = n;
    else if (!strcmp(k, "xid_seq")) g->xid_seq = n;
    else if (!strcmp(k, "unsupported")) snprintf(g->unsupported, sizeof g->unsupported, ",%s,", v);
    else if (!strcmp(k, "fail")) snprintf(g->fail, sizeof g->fail, ",%s,", v);
}

/* Re-read the state file if it changed. Caller holds `lock`. */
static void reload(void) {
    const char *path = getenv("NVML_STUB_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (have_stat && st.st_ino == last_stat.st_ino && st.st_size == last_stat.st_size &&
        st.st_mtim.tv_sec == last_stat.st_mtim.tv_sec && st.st_mtim.tv_nsec == last_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    last_stat = st;
    have_stat = 1;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    char line[4096];
    while (fgets(line, sizeof line, f) && ngpus < MAX_GPUS) {
        char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#') continue;
        gpu_t *g = &gpus[ngpus++];
        snprintf(g->uuid, sizeof g->uuid, "GPU-stub-%d", ngpus - 1);
        for (; tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = '\0';
            parse_pair(g, tok, eq + 1);
        }
    }
    fclose(f);
}

static int listed(const char *list, const char *field) {
    char needle[64];
    snprintf(needle, sizeof needle, ",%s,", field);
    return strstr(list, needle) != NULL;
}

/* Lock, check init, reload, and resolve the handle to its GPU (or fail with the right code). */
#define ENTER(handle, field, gp)                                                            \
    pthread_mutex_lock(&lock);                                                              \
    nvmlReturn_t rc_ = begin((handle), (field), &(gp));                                     \
    if (rc_ != NVML_SUCCESS) { pthread_mutex_unlock(&lock); return rc_; }
#define LEAVE(rc) do { pthread_mutex_unlock(&lock); return (rc); } while (0)

static nvmlReturn_t begin(device_t *h, const char *field, gpu_t **out) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    reload();
    if (h < devices || h >= devices + MAX_GPUS || h->index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &gpus[h->index];
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (field && listed(g->unsupported, field)) return NVML_ERROR_NOT_SUPPORTED;
    if (field && listed(g->fail, field)) return NVML_ERROR_UNKNOWN;
    *out = g;
    return NVML_SUCCESS;
}

/* ---- init / system ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (init_count++ == 0) {
        have_stat = 0;       /* a fresh init reads the (possibly new) $NVML_STUB_STATE */
        for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
        reload();
    }
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count > 0 ? (init_count--, NVML_SUCCESS) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    snprintf(version, length, "999.99-stub");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    pthread_mutex_lock(&lock);
    if (init_count == 0) LEAVE(NVML_ERROR_UNINITIALIZED);
    reload();
    *count = (unsigned)ngpus;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, device_t **device) {
    pthread_mutex_lock(&lock);
    if (init_count == 0) LEAVE(NVML_ERROR_UNINITIALIZED);
    reload();
    if (index >= (unsigned)ngpus) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *device = &devices[index];
    LEAVE(NVML_SUCCESS);
}

/* ---- per-device readings ---- */

nvmlReturn_t nvmlDeviceGetUUID(device_t *h, char *uuid, unsigned length) {
    gpu_t *g = NULL;
    ENTER(h, NULL, g);
    if (strlen(g->uuid) + 1 > length) LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(uuid, g->uuid);
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(device_t *h, char *name, unsigned length) {
    gpu_t *g = NULL;
    ENTER(h, NULL, g);
    snprintf(name, length, "NVML Stub GPU");
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(device_t *h, int sensor, unsigned *temp) {
    gpu_t *g = NULL;
    ENTER(h, "temp", g);
    if (sensor != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(device_t *h, unsigned *mw) {
    gpu_t *g = NULL;
    ENTER(h, "power", g);
    *mw = g->power_mw;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(device_t *h, int type, unsigned *mhz) {
    gpu_t *g = NULL;
    ENTER(h, "clock", g);
    if (type == 0 || type == 1) *mhz = g->sm;        /* graphics, SM */
    else if (type == 2) *mhz = g->mem;               /* memory */
    else LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(device_t *h, nvmlUtilization_t *u) {
    gpu_t *g = NULL;
    ENTER(h, "util", g);
    u->gpu = g->util;
    u->memory = g->memutil;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(device_t *h, nvmlMemory_t *m) {
    gpu_t *g = NULL;
    ENTER(h, "memory", g);
    m->total = g->mem_total;
    m->used = g->mem_used;
    m->free = g->mem_total > g->mem_used ? g->mem_total - g->mem_used : 0;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(device_t *h, nvmlMemory_v2_t *m) {
    gpu_t *g = NULL;
    ENTER(h, "memory", g);
    if (m->version != MEMORY_V2) LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    m->total = g->mem_total;
    m->reserved = 0;
    m->used = g->mem_used;
    m->free = g->mem_total > g->mem_used ? g->mem_total - g->mem_used : 0;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(device_t *h, unsigned long long *reasons) {
    gpu_t *g = NULL;
    ENTER(h, "throttle", g);
    *reasons = g->throttle;
    LEAVE(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(device_t *h, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(h, reasons);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(device_t *h, int errorType, int counterType, unsigned long long *count) {
    gpu_t *g = NULL;
    ENTER(h, "ecc", g);
    if ((errorType != 0 && errorType != 1) || (counterType != 0 && counterType != 1))
        LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = errorType == 0 ? g->ecc_corr : g->ecc_unc;   /* volatile and aggregate alike */
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(device_t *h, int cause, unsigned *count, unsigned long long *addresses) {
    gpu_t *g = NULL;
    ENTER(h, "retired", g);
    if (cause != 0 && cause != 1) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = cause == 0 ? g->retired_sbe : g->retired_dbe;
    if (addresses == NULL || *count < n) {
        *count = n;
        LEAVE(n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned i = 0; i < n; i++) addresses[i] = 0x1000ULL * (i + 1) + (unsigned long long)cause;
    *count = n;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(device_t *h, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failed) {
    gpu_t *g = NULL;
    ENTER(h, "remap", g);
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failed = g->remap_failed;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(device_t *h, unsigned *value) {
    gpu_t *g = NULL;
    ENTER(h, "pcie", g);
    *value = g->pcie_replay;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(device_t *h, unsigned link, int counter, unsigned long long *value) {
    gpu_t *g = NULL;
    ENTER(h, "nvlink", g);
    if (g->nvlinks == 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g->nvlinks || counter < 0 || counter > 4) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *value = counter < 4 ? g->nvlink[counter][link] : 0;   /* 4 = DL_ECC_DATA, always 0 here */
    LEAVE(NVML_SUCCESS);
}

/* ---- events ---- */

nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
    pthread_mutex_lock(&lock);
    if (init_count == 0) LEAVE(NVML_ERROR_UNINITIALIZED);
    *set = calloc(1, sizeof(event_set_t));
    LEAVE(*set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(device_t *h, unsigned long long *types) {
    gpu_t *g = NULL;
    ENTER(h, "events", g);
    *types = XID_EVENT;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(device_t *h, unsigned long long types, event_set_t *set) {
    gpu_t *g = NULL;
    ENTER(h, "events", g);
    if (!set) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~XID_EVENT) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    set->mask[h->index] |= types;
    set->seen_seq[h->index] = g->xid_seq;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, nvmlEventData_t *data, unsigned timeout_ms) {
    struct timespec start, now, nap = {0, 5 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&lock);
        if (init_count == 0) LEAVE(NVML_ERROR_UNINITIALIZED);
        reload();
        for (int i = 0; i < ngpus; i++) {
            gpu_t *g = &gpus[i];
            if ((set->mask[i] & XID_EVENT) && g->xid_seq > set->seen_seq[i]) {
                set->seen_seq[i] = g->xid_seq;
                memset(data, 0, sizeof *data);
                data->device = &devices[i];
                data->eventType = XID_EVENT;
                data->eventData = g->xid;
                data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
                LEAVE(NVML_SUCCESS);
            }
        }
        pthread_mutex_unlock(&lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed_ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed_ms >= (long)timeout_ms) return NVML_ERROR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}
nvmlReturn_t nvmlEventSetWait(event_set_t *set, nvmlEventData_t *data, unsigned timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

nvmlReturn_t nvmlEventSetFree(event_set_t *set) {
    free(set);
    return NVML_SUCCESS;
}
