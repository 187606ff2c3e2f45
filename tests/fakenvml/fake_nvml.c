/*
 * A fake libnvidia-ml.so.1 for accelmon's tests: it answers the NVML calls the exporter makes,
 * through the real pynvml ctypes layer, with deterministic values derived from the GPU index.
 *
 * Configured by the file named in $FAKE_NVML_CONFIG, read at an nvmlInitWithFlags when it changed; one
 * directive per line:
 *   gpus N                      number of GPUs (default 2)
 *   name TEXT                   product name
 *   lost I                      GPU I answers NVML_ERROR_GPU_IS_LOST
 *   unsupported FUNC            FUNC answers NVML_ERROR_NOT_SUPPORTED (all GPUs)
 *   missing FUNC                FUNC answers NVML_ERROR_FUNCTION_NOT_FOUND (an older driver)
 *   unsupported_field ID        field ID answers NOT_SUPPORTED inside nvmlDeviceGetFieldValues
 *   xid I CODE                  queue an XID event CODE on GPU I
 *   mig I COUNT                 GPU I runs in MIG mode with COUNT instances
 *   latency_us N                every call sleeps N microseconds (for latency tests: costs no CPU)
 *   init_error CODE             nvmlInitWithFlags answers CODE (e.g. 999, NVML_ERROR_UNKNOWN): NVML cannot start
 *                               while the driver still lists the GPUs, as after a GPU reset before it recovers
 *   cost h100                   every call burns, on the calling thread, the CPU time it cost on a real H100
 *                               (driver 580, docs/hardware.md; table call_cost_ms below)
 *   profile h100                what a real H100 SXM answered: cost h100, fan speed and retired-page fields
 *                               29-31 NOT_SUPPORTED, driver 580.159.04
 *   hang FUNC                   FUNC blocks until fakeNvmlRelease() is called
 *   gpm I                       GPU I supports GPM (profiling metrics); with `mig I COUNT` too, each MIG instance
 *                               answers nvmlGpmMigSampleGet (SM util 5 % more per instance id)
 *   pcie I GEN WIDTH            GPU I's PCIe link trained at generation GEN and WIDTH lanes (default: 5 and 16, the
 *                               maximum of an H100 SXM in a Gen5 slot; an idle GPU runs at generation 1, as real
 *                               GPUs drop their link speed when idle)
 *   nvlink I LINKS              GPU I has LINKS NVLink links, all up (default: none, as a PCIe GPU: the NVLink calls
 *                               answer NOT_SUPPORTED; an H100 SXM has 18)
 *   nvlink_down I L             GPU I's link L is down
 *   nvlink_unbridged I LINKS    GPU I has LINKS NVLink links wired to nothing, as a PCIe GPU without an NVLink bridge
 *                               (an A100 PCIe has 12): each answers SUCCESS and inactive, its remote device type
 *                               UNKNOWN and its remote PCI info zero, except links a later `nvlink_peer` line
 *                               bridges to another GPU (up). Unmeasured (no PCIe GPU with NVLink was lent): DCGM's
 *                               health watch reports such a GPU's 12 links down (NVIDIA/DCGM#49, NVIDIA/NVSentinel
 *                               #1481 on an A100 80GB PCIe, driver 570.133.20), which needs the state call to
 *                               answer; what the remote calls answer there is nowhere reported
 *   nvlink_errors I L TYPE N    GPU I's link L has counted N errors of TYPE (0 replay, 1 recovery, 2 CRC flit,
 *                               3 CRC data: nvmlNvLinkErrorCounter_t) since the driver loaded
 *   nvlink_peer I L J           GPU I's link L leads straight to GPU J (an NVLink bridge, or a board without
 *                               NVSwitch); every other link leads to an NVSwitch (nvmlNvLinkDeviceType_t 2), as on
 *                               an HGX H100 board, at bus 0xC0 + L % 4 (its four switches)
 *   capability I MAJOR MINOR    GPU I's CUDA compute capability (default 9.0, Hopper; 7.0 a Volta V100)
 *   process I PID MIB [GI]      GPU I runs compute process PID using MIB MiB (in MIG instance GI); repeatable; the
 *                               first one for a GPU replaces its default processes (index % 3 of them, 512 MiB each)
 *   process_samples 1           nvmlDeviceGetProcessUtilization answers a sample per running process (SM 10 % plus 5 %
 *                               per PID mod 7, memory half that); default: NOT_FOUND, "no sample since that time"
 *   slow_file PATH              the GPUs whose indices PATH lists (one per line; re-read when it changes, at most once a
 *                               second) run slowed, as a GPU under a power cap does: SM clock and power at 60 %, the
 *                               software power cap among its clock events. A test slows a GPU mid-run by writing PATH.
 *                               "INDEX quiet" slows it with no clock event of its own, as a GPU held back by what lies
 *                               beyond it (its network, its host) runs.
 *   fabric I STATE STATUS MASK  GPU I is on an NVLink fabric (nvmlDeviceGetGpuFabricInfo[V]): STATE 1 not started,
 *                               2 in progress, 3 completed; STATUS the NVML return code of its registration; MASK
 *                               the health mask (default: no fabric, state 0 = NOT_SUPPORTED, as a PCIe Hopper GPU)
 * GPM answers like the H100 did: two samples less than 100 ms apart give SUCCESS with every metric 0 and
 * DRAM bandwidth NaN (nvml.h asks for more than 100 ms; the driver does not return an error).
 * Test helpers (not NVML): fakeNvmlCallCount(), fakeNvmlCallsOf(name), fakeNvmlSetLost(i, lost), fakeNvmlRelease(),
 * fakeNvmlQueueXid(i, code).
 */
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, ERR_UNINITIALIZED = 1, ERR_INVALID_ARGUMENT = 2, ERR_NOT_SUPPORTED = 3, ERR_NOT_FOUND = 6,
    ERR_INSUFFICIENT_SIZE = 7, ERR_TIMEOUT = 10, ERR_FUNCTION_NOT_FOUND = 13, ERR_GPU_IS_LOST = 15,
    ERR_UNKNOWN = 999
};
#define MAX_GPUS 16
#define MAX_MIG 7
#define MAX_NAMES 32
#define MAX_EVENTS 64

typedef struct device {
    int index;
    int is_mig;
    int parent;
} device_t;

static device_t gpus[MAX_GPUS];
static device_t migs[MAX_GPUS][MAX_MIG];
static int gpu_count = 2;
static char product_name[96] = "NVIDIA H100 80GB HBM3";
static int lost[MAX_GPUS];
static char slow_path[160];
static int mig_count[MAX_GPUS];
static int gpm_supported[MAX_GPUS];
static char unsupported[MAX_NAMES][64];
static int n_unsupported;
static char missing[MAX_NAMES][64];
static int n_missing;
static char hanging[MAX_NAMES][64];
static int n_hanging;
static unsigned unsupported_fields[MAX_NAMES];
static int n_unsupported_fields;
static long latency_us;
static int init_error;  /* what nvmlInitWithFlags answers: 0, or the error of an NVML that cannot start */
static int cost_model;
static int energy_follows_power;          /* the energy counter grows by power x time (energy_follows_power 1) */
static struct timespec loaded_at;
static char driver_version[32] = "550.54.15";
static int initialized;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long call_count;
#define MAX_COUNTED 128
static struct { const char *fn; unsigned long long calls; } counted[MAX_COUNTED];  /* calls per entry point */
static struct { int gpu; unsigned long long xid; } events[MAX_EVENTS];
static int pcie_gen[MAX_GPUS], pcie_width[MAX_GPUS];  /* 0: the default link */
#define MAX_LINKS 18
static int nvlinks[MAX_GPUS];                        /* links per GPU; 0 = no NVLink */
static int nvlink_down[MAX_GPUS][MAX_LINKS];
static int nvlink_peer[MAX_GPUS][MAX_LINKS];        /* GPU index + 1 at the link's other end; 0 = a switch */
static int nvlink_unwired[MAX_GPUS][MAX_LINKS];     /* 1: the link leads nowhere (a PCIe GPU without a bridge) */
static int capability[MAX_GPUS][2];                   /* compute capability; {0, 0} = 9.0 */
static unsigned long long nvlink_errors[MAX_GPUS][MAX_LINKS][4];
static struct { int state, status; unsigned mask; } fabric[MAX_GPUS];
#define MAX_PROCS 8
static struct { unsigned pid, gi; unsigned long long mib; } procs_of[MAX_GPUS][MAX_PROCS];
static int n_procs[MAX_GPUS];                        /* -1: the default processes */
static int process_samples;
static int n_events;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static pthread_cond_t event_queued = PTHREAD_COND_INITIALIZER;
static int release_generation;

static int listed(char list[][64], int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], name) == 0) return 1;
    return 0;
}

static void add_name(char list[][64], int *n, const char *name) {
    if (*n < MAX_NAMES) snprintf(list[(*n)++], 64, "%s", name);
}

static void read_config(void) {
    gpu_count = 2;
    snprintf(product_name, sizeof product_name, "NVIDIA H100 80GB HBM3");
    n_unsupported = n_missing = n_hanging = n_unsupported_fields = n_events = 0;
    latency_us = 0;
    init_error = 0;
    cost_model = 0;
    snprintf(driver_version, sizeof driver_version, "550.54.15");
    memset(lost, 0, sizeof lost);
    memset(mig_count, 0, sizeof mig_count);
    memset(gpm_supported, 0, sizeof gpm_supported);
    memset(pcie_gen, 0, sizeof pcie_gen);
    memset(pcie_width, 0, sizeof pcie_width);
    memset(nvlinks, 0, sizeof nvlinks);
    memset(nvlink_down, 0, sizeof nvlink_down);
    memset(nvlink_errors, 0, sizeof nvlink_errors);
    memset(nvlink_peer, 0, sizeof nvlink_peer);
    memset(nvlink_unwired, 0, sizeof nvlink_unwired);
    memset(capability, 0, sizeof capability);
    memset(fabric, 0, sizeof fabric);
    for (int i = 0; i < MAX_GPUS; i++) n_procs[i] = -1;
    process_samples = 0;
    energy_follows_power = 0;
    slow_path[0] = 0;
    clock_gettime(CLOCK_MONOTONIC, &loaded_at);
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[256], key[64], arg[160];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%63s %159[^\n]", key, arg) < 2) continue;
        int a = 0, b = 0, c = 0;
        unsigned long long count = 0;
        unsigned mask = 0;
        int given = 0;
        if (!strcmp(key, "gpus")) gpu_count = atoi(arg) > MAX_GPUS ? MAX_GPUS : atoi(arg);
        else if (!strcmp(key, "name")) snprintf(product_name, sizeof product_name, "%s", arg);
        else if (!strcmp(key, "lost") && (a = atoi(arg)) < MAX_GPUS) lost[a] = 1;
        else if (!strcmp(key, "unsupported")) add_name(unsupported, &n_unsupported, arg);
        else if (!strcmp(key, "missing")) add_name(missing, &n_missing, arg);
        else if (!strcmp(key, "hang")) add_name(hanging, &n_hanging, arg);
        else if (!strcmp(key, "unsupported_field") && n_unsupported_fields < MAX_NAMES)
            unsupported_fields[n_unsupported_fields++] = (unsigned)atoi(arg);
        else if (!strcmp(key, "latency_us")) latency_us = atol(arg);
        else if (!strcmp(key, "init_error")) init_error = atoi(arg);
        else if (!strcmp(key, "cost") && !strcmp(arg, "h100")) cost_model = 1;
        else if (!strcmp(key, "profile") && !strcmp(arg, "h100")) {
            cost_model = 1;
            snprintf(driver_version, sizeof driver_version, "580.159.04");
            add_name(unsupported, &n_unsupported, "nvmlDeviceGetFanSpeed");
            for (unsigned id = 29; id <= 31 && n_unsupported_fields < MAX_NAMES; id++)
                unsupported_fields[n_unsupported_fields++] = id;
        }
        else if (!strcmp(key, "gpm") && (a = atoi(arg)) < MAX_GPUS) gpm_supported[a] = 1;
        else if (!strcmp(key, "slow_file")) snprintf(slow_path, sizeof slow_path, "%s", arg);
        /* energy_follows_power 1: the energy counter grows by the GPU's power draw, as a real one does (the
           default keeps it constant, so golden expositions stay the same from run to run). */
        else if (!strcmp(key, "energy_follows_power")) energy_follows_power = atoi(arg);
        else if (!strcmp(key, "mig") && sscanf(arg, "%d %d", &a, &b) == 2 && a < MAX_GPUS)
            mig_count[a] = b > MAX_MIG ? MAX_MIG : b;
        else if (!strcmp(key, "pcie") && sscanf(arg, "%d %d %d", &a, &b, &c) == 3 && a >= 0 && a < MAX_GPUS) {
            pcie_gen[a] = b;
            pcie_width[a] = c;
        }
        else if (!strcmp(key, "nvlink") && sscanf(arg, "%d %d", &a, &b) == 2 && a >= 0 && a < MAX_GPUS)
            nvlinks[a] = b < 0 ? 0 : b > MAX_LINKS ? MAX_LINKS : b;
        else if (!strcmp(key, "nvlink_unbridged") && sscanf(arg, "%d %d", &a, &b) == 2 && a >= 0 && a < MAX_GPUS) {
            nvlinks[a] = b < 0 ? 0 : b > MAX_LINKS ? MAX_LINKS : b;
            for (int link = 0; link < MAX_LINKS; link++) nvlink_unwired[a][link] = 1;
        }
        else if (!strcmp(key, "nvlink_down") && sscanf(arg, "%d %d", &a, &b) == 2 && a >= 0 && a < MAX_GPUS
                 && b >= 0 && b < MAX_LINKS)
            nvlink_down[a][b] = 1;
        else if (!strcmp(key, "nvlink_errors") && sscanf(arg, "%d %d %d %llu", &a, &b, &c, &count) == 4 && a >= 0
                 && a < MAX_GPUS && b >= 0 && b < MAX_LINKS && c >= 0 && c < 4)
            nvlink_errors[a][b][c] = count;
        else if (!strcmp(key, "nvlink_peer") && sscanf(arg, "%d %d %d", &a, &b, &c) == 3 && a >= 0 && a < MAX_GPUS
                 && b >= 0 && b < MAX_LINKS && c >= 0 && c < MAX_GPUS) {
            nvlink_peer[a][b] = c + 1;
            nvlink_unwired[a][b] = 0;
        }
        else if (!strcmp(key, "capability") && sscanf(arg, "%d %d %d", &a, &b, &c) == 3 && a >= 0 && a < MAX_GPUS) {
            capability[a][0] = b;
            capability[a][1] = c;
        }
        else if (!strcmp(key, "process") && (given = sscanf(arg, "%d %d %llu %d", &a, &b, &count, &c)) >= 3 && a >= 0
                 && a < MAX_GPUS) {
            if (n_procs[a] < 0) n_procs[a] = 0;
            if (n_procs[a] < MAX_PROCS) {
                procs_of[a][n_procs[a]].pid = (unsigned)b;
                procs_of[a][n_procs[a]].mib = count;
                procs_of[a][n_procs[a]++].gi = given == 4 ? (unsigned)c : 0xFFFFFFFF;
            }
        }
        else if (!strcmp(key, "process_samples")) process_samples = atoi(arg);
        else if (!strcmp(key, "fabric") && sscanf(arg, "%d %d %d %u", &a, &b, &c, &mask) == 4 && a >= 0 && a < MAX_GPUS) {
            fabric[a].state = b;
            fabric[a].status = c;
            fabric[a].mask = mask;
        }
        else if (!strcmp(key, "xid") && sscanf(arg, "%d %d", &a, &b) == 2 && n_events < MAX_EVENTS) {
            events[n_events].gpu = a;
            events[n_events++].xid = (unsigned long long)b;
        }
    }
    fclose(f);
}

/* CPU time (ms) one call cost on the H100 (docs/hardware.md: 2026-11-23, means of 30-50 calls; 2026-11-26, the
 * medians of 5 calls with the GPU idle and of 3 under a bf16 matmul load, averaged). Calls not listed were measured
 * at 0.003-0.04 ms: DEFAULT_COST_MS. nvmlDeviceGetFieldValues is charged per field (field_cost_ms). */
#define DEFAULT_COST_MS 0.010
static const struct { const char *fn; double ms; } call_cost_ms[] = {
    {"nvmlDeviceGetTotalEnergyConsumption", 4.05},
    {"nvmlDeviceGetMaxClockInfo", 1.50},          /* read once */
    {"nvmlDeviceGetViolationStatus", 0.74},
    {"nvmlDeviceGetPcieThroughput", 0.85},       /* and 20 ms of wall time: it waits for its window */
    {"nvmlDeviceGetBAR1MemoryInfo", 0.34},
    {"nvmlDeviceGetMigMode", 0.38},
    {"nvmlDeviceGetMaxMigDeviceCount", 0.31},
    {"nvmlDeviceGetPcieReplayCounter", 0.19},
    {"nvmlDeviceGetFanSpeed", 0.20},              /* NOT_SUPPORTED on an H100 SXM, and still this dear */
    {"nvmlDeviceGetProcessUtilization", 2.50},    /* NOT_FOUND on an idle GPU 2.9, a sample per process 2.2 */
    {"nvmlDeviceGetGpuInstanceProfileInfoV", 0.35}, /* read once, per profile index (18 of them: 6.5 ms) */
    {"nvmlDeviceRegisterEvents", 1.6},            /* once at start */
    {"nvmlDeviceGetCurrPcieLinkWidth", 0.036},
    {"nvmlDeviceGetGpuFabricInfo", 0.06},
    {"nvmlDeviceGetGpuFabricInfoV", 0.035},
    {"nvmlDeviceGetNvLinkState", 0.022},          /* per link; answering NOT_SUPPORTED (no NVLink on that VM) */
    {"nvmlDeviceGetNvLinkErrorCounter", 0.022},   /* likewise */
    {"nvmlDeviceGetComputeRunningProcesses_v3", 0.037},
    {"nvmlDeviceGetUtilizationRates", 0.013},
    {"nvmlDeviceGetMemoryInfo_v2", 0.021},
    {"nvmlDeviceGetSamples", 0.47},               /* power samples; GPU-utilization samples cost 2.7 */
    {"nvmlGpmSampleGet", 0.35},
    {"nvmlGpmMigSampleGet", 0.35},                /* assumed as the GPU's: unmeasured (no H100 in MIG mode lent) */
    {"nvmlGpmMetricsGet", 0.0},                   /* charged per metric: 0.18 ms each */
    {"nvmlDeviceGetFieldValues", 0.05},           /* plus field_cost_ms per field */
    {"nvmlEventSetWait_v2", 0.125},               /* per wait, whatever its timeout (100 ms to 5 s); none while waiting */
};
#define GPM_METRIC_COST_MS 0.18

static double field_cost_ms(unsigned id) {
    switch (id) {
    case 83: return 4.02;                         /* energy: as dear as its own call */
    case 94: return 0.19;                         /* PCIe replays */
    case 3: return 0.09;                          /* ECC SBE volatile */
    case 82: return 0.08;                         /* memory temperature */
    /* Not measured one by one: 29-31 (NOT_SUPPORTED on H100) are given what makes the 14 fields without 83
     * cost the 0.7 ms measured for them together. */
    case 29: case 30: case 31: return 0.09;
    default: return 0.006;                        /* 4-6, 142-145 */
    }
}

/* Spend ms of this thread's CPU time, as the real library does computing an answer. */
static void burn_cpu(double ms) {
    if (ms <= 0) return;
    struct timespec start, now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    while ((double)(now.tv_sec - start.tv_sec) * 1e3 + (double)(now.tv_nsec - start.tv_nsec) / 1e6 < ms);
}

static double cost_of(const char *fn) {
    for (size_t k = 0; k < sizeof call_cost_ms / sizeof call_cost_ms[0]; k++)
        if (!strcmp(call_cost_ms[k].fn, fn)) return call_cost_ms[k].ms;
    return DEFAULT_COST_MS;
}

/* Every entry point starts here: count, delay, cost, and the configured failure modes. */
static nvmlReturn_t enter(const char *fn) {
    int generation;
    pthread_mutex_lock(&lock);
    call_count++;
    for (int k = 0; k < MAX_COUNTED; k++)
        if (!counted[k].fn || counted[k].fn == fn) { counted[k].fn = fn; counted[k].calls++; break; }
    generation = release_generation;
    int hang = listed(hanging, n_hanging, fn);
    int is_missing = listed(missing, n_missing, fn);
    int is_unsupported = listed(unsupported, n_unsupported, fn);
    if (hang)
        while (generation == release_generation) pthread_cond_wait(&released, &lock);
    pthread_mutex_unlock(&lock);
    if (latency_us > 0) usleep((useconds_t)latency_us);
    if (cost_model) burn_cpu(cost_of(fn));
    if (is_missing) return ERR_FUNCTION_NOT_FOUND;
    if (is_unsupported) return ERR_NOT_SUPPORTED;
    if (!initialized && strcmp(fn, "nvmlInitWithFlags") && strcmp(fn, "nvmlErrorString")) return ERR_UNINITIALIZED;
    return OK;
}

#define ENTER() do { nvmlReturn_t r_ = enter(__func__); if (r_ != OK) return r_; } while (0)
#define DEVICE(d) do { ENTER(); if (!(d)) return ERR_INVALID_ARGUMENT; \
    if (lost[(d)->is_mig ? (d)->parent : (d)->index]) return ERR_GPU_IS_LOST; } while (0)

/* ---- test helpers ---- */
unsigned long long fakeNvmlCallCount(void) { return call_count; }
unsigned long long fakeNvmlCallsOf(const char *fn) {
    unsigned long long n = 0;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < MAX_COUNTED && counted[k].fn; k++)
        if (!strcmp(counted[k].fn, fn)) n = counted[k].calls;
    pthread_mutex_unlock(&lock);
    return n;
}
void fakeNvmlSetLost(int index, int value) { if (index >= 0 && index < MAX_GPUS) lost[index] = value; }
void fakeNvmlRelease(void) {
    pthread_mutex_lock(&lock);
    release_generation++;
    pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&lock);
}
void fakeNvmlQueueXid(int index, unsigned long long xid) {
    pthread_mutex_lock(&lock);
    if (n_events < MAX_EVENTS) { events[n_events].gpu = index; events[n_events++].xid = xid; }
    pthread_cond_broadcast(&event_queued);
    pthread_mutex_unlock(&lock);
}

/* ---- library ---- */
/* The configuration is read again at an init only when its file changed since it was last read (tests rewrite it
 * between runs). Re-reading an unchanged file reset every array under the collectors already reading it: one
 * collector's init once made another's read of a GPU's NVLink links find none, and those links were never asked
 * again. Real NVML's init never changes what an initialised reader sees. */
static struct stat config_seen;
static int config_generation;  /* how often the configuration was read: event sets remember theirs */
static int config_read;
static int config_changed(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat now;
    if (!path || stat(path, &now) != 0) return 1;
    int changed = !config_read || now.st_ino != config_seen.st_ino || now.st_size != config_seen.st_size ||
                  now.st_mtim.tv_sec != config_seen.st_mtim.tv_sec || now.st_mtim.tv_nsec != config_seen.st_mtim.tv_nsec;
    config_seen = now;
    config_read = 1;
    return changed;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&init_lock);
    if (config_changed()) {
        read_config();
        config_generation++;
        for (int i = 0; i < MAX_GPUS; i++) {
            gpus[i].index = i; gpus[i].is_mig = 0; gpus[i].parent = i;
            for (int m = 0; m < MAX_MIG; m++) { migs[i][m].index = m; migs[i][m].is_mig = 1; migs[i][m].parent = i; }
        }
    }
    int refused = init_error;
    pthread_mutex_unlock(&init_lock);
    ENTER();
    if (refused) return (nvmlReturn_t)refused;
    pthread_mutex_lock(&init_lock);
    initialized++;
    pthread_mutex_unlock(&init_lock);
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
/* As NVML's: a count of initializations, shut down when it reaches zero (the API reference's nvmlShutdown: "once for
 * each call to nvmlInit ... Shutdown only occurs when the reference count reaches zero"). Two sessions in one process
 * (the nvml collector's and the infiniband collector's NVLink bridge reading) each init and shut down: before, the
 * second's shutdown left the first's calls UNINITIALIZED, which real NVML never does. */
nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    pthread_mutex_lock(&init_lock);
    if (initialized > 0) initialized--;
    pthread_mutex_unlock(&init_lock);
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    case ERR_TIMEOUT: return "Timeout";
    case ERR_FUNCTION_NOT_FOUND: return "Function Not Found";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { ENTER(); snprintf(v, n, "%s", driver_version); return OK; }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) { ENTER(); snprintf(v, n, "12.550.54.15"); return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { ENTER(); *v = 12040; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { ENTER(); *v = 12040; return OK; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { ENTER(); *count = (unsigned)gpu_count; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, device_t **dev) {
    ENTER();
    if ((int)i >= gpu_count) return ERR_INVALID_ARGUMENT;
    *dev = &gpus[i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetIndex(device_t *d, unsigned int *i) { ENTER(); *i = (unsigned)d->index; return OK; }
nvmlReturn_t nvmlDeviceGetName(device_t *d, char *name, unsigned int n) { DEVICE(d); snprintf(name, n, "%s", product_name); return OK; }
nvmlReturn_t nvmlDeviceGetUUID(device_t *d, char *uuid, unsigned int n) {
    DEVICE(d);
    if (d->is_mig) snprintf(uuid, n, "MIG-%08d-0000-4000-8000-%012d", d->parent, d->index);
    else snprintf(uuid, n, "GPU-%08d-0000-4000-8000-000000000000", d->index);
    return OK;
}
nvmlReturn_t nvmlDeviceGetSerial(device_t *d, char *s, unsigned int n) { DEVICE(d); snprintf(s, n, "16500000%05d", d->index); return OK; }
nvmlReturn_t nvmlDeviceGetVbiosVersion(device_t *d, char *s, unsigned int n) { DEVICE(d); snprintf(s, n, "96.00.89.00.01"); return OK; }
nvmlReturn_t nvmlDeviceGetMinorNumber(device_t *d, unsigned int *m) { DEVICE(d); *m = (unsigned)d->index; return OK; }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(device_t *d, int *major, int *minor) {
    DEVICE(d);
    *major = capability[d->index][0] ? capability[d->index][0] : 9;
    *minor = capability[d->index][0] ? capability[d->index][1] : 0;
    return OK;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_info_t;
nvmlReturn_t nvmlDeviceGetPciInfo_v3(device_t *d, pci_info_t *p) {
    DEVICE(d);
    memset(p, 0, sizeof *p);
    p->bus = 0x18 + (unsigned)d->index * 0x10;
    p->pciDeviceId = 0x233010de;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return OK;
}

typedef struct { unsigned int gpu, memory; } utilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(device_t *d, utilization_t *u) {
    DEVICE(d);
    u->gpu = 10 + (unsigned)d->index * 10 > 100 ? 100 : 10 + (unsigned)d->index * 10;
    u->memory = 5 + (unsigned)d->index * 5 > 100 ? 100 : 5 + (unsigned)d->index * 5;
    return OK;
}

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } memory_v2_t;
#define GIB (1024ULL * 1024 * 1024)
#define MIB (1024ULL * 1024)
static void memory_of(const device_t *d, memory_v2_t *m) {
    if (d->is_mig) {
        m->total = 10 * GIB; m->reserved = 0; m->used = (unsigned long long)(d->index + 1) * GIB;
    } else {
        /* What the H100 80GB HBM3 answered (docs/hardware.md): 79.6 GiB, 480 MiB of it reserved. */
        m->total = 85520809984ULL; m->reserved = 480 * MIB; m->used = (unsigned long long)(d->index + 1) * GIB;
    }
    m->free = m->total - m->reserved - m->used;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(device_t *d, memory_v2_t *m) { DEVICE(d); memory_of(d, m); return OK; }

typedef struct { unsigned long long total, free, used; } memory_v1_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(device_t *d, memory_v1_t *m) {
    memory_v2_t v2;
    DEVICE(d);
    memory_of(d, &v2);
    m->total = v2.total; m->free = v2.free + v2.reserved; m->used = v2.used;
    return OK;
}

typedef struct { unsigned long long total, free, used; } bar1_t;
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(device_t *d, bar1_t *b) {
    DEVICE(d);
    b->total = 128 * GIB; b->used = (unsigned long long)(d->index + 1) * 2 * MIB; b->free = b->total - b->used;
    return OK;
}

typedef struct { unsigned int version; int sensorType; int temperature; } temperature_v1_t;
nvmlReturn_t nvmlDeviceGetTemperatureV(device_t *d, temperature_v1_t *t) { DEVICE(d); t->temperature = 40 + d->index; return OK; }
nvmlReturn_t nvmlDeviceGetTemperature(device_t *d, int sensor, unsigned int *t) { (void)sensor; DEVICE(d); *t = 40 + (unsigned)d->index; return OK; }

/* slow_file: which GPUs run slowed now. Read again when the file changed, at most once a second (a GPU slowed
 * mid-run; a missing file slows none). */
static int slowed(int index) {
    static pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;
    static int slow[MAX_GPUS];
    static time_t checked;
    static struct stat seen;
    if (!slow_path[0] || index < 0 || index >= MAX_GPUS) return 0;
    pthread_mutex_lock(&slow_lock);
    time_t now = time(NULL);
    if (now != checked) {
        checked = now;
        struct stat st;
        int exists = stat(slow_path, &st) == 0;
        if (!exists) memset(slow, 0, sizeof slow);
        else if (st.st_mtim.tv_sec != seen.st_mtim.tv_sec || st.st_mtim.tv_nsec != seen.st_mtim.tv_nsec ||
                 st.st_size != seen.st_size || st.st_ino != seen.st_ino) {
            memset(slow, 0, sizeof slow);
            FILE *f = fopen(slow_path, "r");
            char line[64], word[16];
            int i;
            while (f && fgets(line, sizeof line, f)) {
                word[0] = 0;
                if (sscanf(line, "%d %15s", &i, word) >= 1 && i >= 0 && i < MAX_GPUS)
                    slow[i] = strcmp(word, "quiet") ? 1 : 2;  /* 2: slowed without a clock event */
            }
            if (f) fclose(f);
        }
        seen = exists ? st : (struct stat){0};
    }
    int answer = slow[index];
    pthread_mutex_unlock(&slow_lock);
    return answer;
}

static unsigned power_mw(int index) {
    unsigned mw = 100000 + (unsigned)index * 10500;
    return slowed(index) ? mw * 6 / 10 : mw;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(device_t *d, unsigned int *mw) { DEVICE(d); *mw = power_mw(d->index); return OK; }

/* mJ drawn since the library was loaded: the GPU's power integrated over time (mW x s), each read adding the power
 * it draws now over the time since the last read, so a GPU slowed mid-run (slow_file) counts less, never back. */
static unsigned long long energy_since_load_mj(int index) {
    static pthread_mutex_t energy_lock = PTHREAD_MUTEX_INITIALIZER;
    static double drawn_mj[MAX_GPUS];
    static struct timespec last[MAX_GPUS];
    if (!energy_follows_power || index < 0 || index >= MAX_GPUS) return 0;
    pthread_mutex_lock(&energy_lock);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const struct timespec *since = last[index].tv_sec || last[index].tv_nsec ? &last[index] : &loaded_at;
    double seconds = (double)(now.tv_sec - since->tv_sec) + (double)(now.tv_nsec - since->tv_nsec) / 1e9;
    if (seconds > 0) drawn_mj[index] += power_mw(index) * seconds;
    last[index] = now;
    unsigned long long answer = (unsigned long long)drawn_mj[index];
    pthread_mutex_unlock(&energy_lock);
    return answer;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(device_t *d, unsigned int *mw) { DEVICE(d); *mw = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(device_t *d, unsigned int *mw) { DEVICE(d); *mw = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(device_t *d, unsigned long long *mj) { DEVICE(d); *mj = 123456789ULL + (unsigned long long)d->index; return OK; }

/* clock type: 0 graphics, 1 SM, 2 memory, 3 video */
nvmlReturn_t nvmlDeviceGetClockInfo(device_t *d, int type, unsigned int *mhz) {
    DEVICE(d);
    *mhz = type == 2 ? 2619 : 1755 - (unsigned)d->index * 15;
    if (type != 2 && slowed(d->index)) *mhz = *mhz * 6 / 10;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(device_t *d, int type, unsigned int *mhz) { DEVICE(d); *mhz = type == 2 ? 2619 : 1980; return OK; }

static unsigned long long clock_reasons(const device_t *d) {
    static const unsigned long long by_index[] = {0x1 /* idle */, 0x4 /* sw power cap */, 0x40 /* hw thermal */, 0x0};
    return by_index[d->index % 4] | (slowed(d->index) == 1 ? 0x4 /* sw power cap */ : 0);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(device_t *d, unsigned long long *r) { DEVICE(d); *r = clock_reasons(d); return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(device_t *d, unsigned long long *r) { DEVICE(d); *r = clock_reasons(d); return OK; }

nvmlReturn_t nvmlDeviceGetPerformanceState(device_t *d, int *p) { DEVICE(d); *p = d->index % 2 ? 2 : 0; return OK; }
nvmlReturn_t nvmlDeviceGetEncoderUtilization(device_t *d, unsigned int *u, unsigned int *period) { DEVICE(d); *u = (unsigned)d->index; *period = 100000; return OK; }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(device_t *d, unsigned int *u, unsigned int *period) { DEVICE(d); *u = 2 * (unsigned)d->index; *period = 100000; return OK; }
nvmlReturn_t nvmlDeviceGetFanSpeed(device_t *d, unsigned int *s) { DEVICE(d); *s = 30 + (unsigned)d->index; return OK; }

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } process_t;
/* The compute processes of GPU d: the configured ones, else index % 3 of them (pids 1000 + 10 * index + k). */
static unsigned processes_of(const device_t *d, process_t *out, unsigned max) {
    unsigned n = n_procs[d->index] >= 0 ? (unsigned)n_procs[d->index] : (unsigned)d->index % 3;
    for (unsigned k = 0; k < n && k < max; k++) {
        if (n_procs[d->index] >= 0) {
            out[k].pid = procs_of[d->index][k].pid;
            out[k].usedGpuMemory = procs_of[d->index][k].mib * MIB;
            out[k].gpuInstanceId = out[k].computeInstanceId = procs_of[d->index][k].gi;
        } else {
            out[k].pid = 1000 + (unsigned)d->index * 10 + k;
            out[k].usedGpuMemory = 512 * MIB;
            out[k].gpuInstanceId = out[k].computeInstanceId = 0xFFFFFFFF;
        }
    }
    return n;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(device_t *d, unsigned int *count, process_t *procs) {
    DEVICE(d);
    process_t all[MAX_PROCS];
    unsigned n = processes_of(d, all, MAX_PROCS);
    if (n == 0) { *count = 0; return OK; }
    if (!procs || *count < n) { *count = n; return ERR_INSUFFICIENT_SIZE; }
    memcpy(procs, all, n * sizeof *procs);
    *count = n;
    return OK;
}

/* Graphics processes: none (a compute node). Asked for by nvitop-exporter, the benchmark's peer. */
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(device_t *d, unsigned int *count, process_t *procs) {
    (void)procs;
    DEVICE(d);
    *count = 0;
    return OK;
}
/* Per-process utilization. Default: "no sample since that time stamp" (NOT_FOUND), as the driver answers between
 * its samples; with process_samples 1, one sample per running process, stamped now. On the H100 it cost 2.9 ms
 * answering NOT_FOUND and 2.2 ms answering one process's sample (docs/hardware.md). */
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } process_sample_t;
nvmlReturn_t nvmlDeviceGetProcessUtilization(device_t *d, process_sample_t *samples, unsigned int *count, unsigned long long since) {
    (void)since;
    DEVICE(d);
    process_t all[MAX_PROCS];
    unsigned n = process_samples ? processes_of(d, all, MAX_PROCS) : 0;
    if (n == 0) { *count = 0; return ERR_NOT_FOUND; }
    if (!samples || *count < n) { *count = n; return ERR_INSUFFICIENT_SIZE; }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (unsigned k = 0; k < n; k++) {
        samples[k].pid = all[k].pid;
        samples[k].timeStamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
        samples[k].smUtil = 10 + (all[k].pid % 7) * 5;
        samples[k].memUtil = samples[k].smUtil / 2;
        samples[k].encUtil = samples[k].decUtil = 0;
    }
    *count = n;
    return OK;
}

typedef struct { unsigned long long referenceTime, violationTime; } violation_t;
nvmlReturn_t nvmlDeviceGetViolationStatus(device_t *d, int policy, violation_t *v) {
    DEVICE(d);
    v->referenceTime = 1700000000000000ULL;
    v->violationTime = (unsigned long long)d->index * (policy == 0 ? 1000000000ULL : 500000000ULL);
    return OK;
}

/* The PCIe link. An H100 SXM in a Gen5 slot: generation 5, 16 lanes, idle or busy (the H100 measured stayed at
 * Gen5 x16 while idle in P0; GPUs that save power drop to generation 1: `pcie I 1 16` says so). The width costs
 * 0.036 ms, the others 0.004 (docs/hardware.md). */
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(device_t *d, unsigned int *gen) { DEVICE(d); *gen = 5; return OK; }
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(device_t *d, unsigned int *gen) { DEVICE(d); *gen = 5; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(device_t *d, unsigned int *width) { DEVICE(d); *width = 16; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(device_t *d, unsigned int *gen) {
    DEVICE(d);
    *gen = pcie_gen[d->index] ? (unsigned)pcie_gen[d->index] : 5;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(device_t *d, unsigned int *width) {
    DEVICE(d);
    *width = pcie_width[d->index] ? (unsigned)pcie_width[d->index] : 16;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(device_t *d, int counter, unsigned int *kbps) {
    DEVICE(d);
    if (cost_model) usleep(20000);
    *kbps = (unsigned)(d->index + 1) * (counter == 0 ? 1000 : 2000);
    return OK;
}

/* ---- NVLink and the GPU fabric ----
 * A link past the GPU's last answers INVALID_ARGUMENT, a GPU without NVLink NOT_SUPPORTED (nvml.h; the single H100
 * measured, in a VM, answered NOT_SUPPORTED for every one of pynvml's 36 links at 0.014-0.029 ms a call). */
static nvmlReturn_t link_of(const device_t *d, unsigned link) {
    if (!nvlinks[d->index]) return ERR_NOT_SUPPORTED;
    return link < (unsigned)nvlinks[d->index] ? OK : ERR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(device_t *d, unsigned int link, unsigned int *active) {
    DEVICE(d);
    nvmlReturn_t r = link_of(d, link);
    if (r == OK) *active = !nvlink_down[d->index][link] && !nvlink_unwired[d->index][link];
    return r;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(device_t *d, unsigned int link, int counter, unsigned long long *value) {
    DEVICE(d);
    nvmlReturn_t r = link_of(d, link);
    if (r != OK) return r;
    if (counter < 0 || counter > 4) return ERR_INVALID_ARGUMENT;
    *value = counter == 4 ? 0 : nvlink_errors[d->index][link][counter];  /* 4: ECC data, 0 on this fake */
    return OK;
}
/* What a link leads to (nvml.h: nvmlDeviceGetNvLinkRemoteDeviceType, nvmlDeviceGetNvLinkRemotePciInfo_v2): another
 * GPU of this fake (its own PCI address) or an NVSwitch. Unmeasured: the lent H100 had no NVLink. */
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(device_t *d, unsigned int link, unsigned int *type) {
    DEVICE(d);
    nvmlReturn_t r = link_of(d, link);
    if (r == OK) *type = nvlink_unwired[d->index][link] ? 0xFF : nvlink_peer[d->index][link] ? 0 : 2;
    return r;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(device_t *d, unsigned int link, pci_info_t *p) {
    DEVICE(d);
    nvmlReturn_t r = link_of(d, link);
    if (r != OK) return r;
    int peer = nvlink_peer[d->index][link];
    memset(p, 0, sizeof *p);
    if (nvlink_unwired[d->index][link]) {
        snprintf(p->busId, sizeof p->busId, "00000000:00:00.0");
        snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:00:00.0");
        return OK;
    }
    p->bus = peer ? 0x18 + (unsigned)(peer - 1) * 0x10 : 0xC0 + link % 4;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return OK;
}
typedef struct { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId, state; } fabric_v1_t;
typedef struct {
    unsigned int version; unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId, state, healthMask;
    unsigned char healthSummary;
} fabric_v3_t;
static void cluster_uuid(int index, unsigned char *uuid) {
    for (int k = 0; k < 16; k++) uuid[k] = fabric[index].state ? (unsigned char)(0xa0 + k) : 0;
}
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(device_t *d, fabric_v1_t *f) {
    DEVICE(d);
    cluster_uuid(d->index, f->clusterUuid);
    f->status = fabric[d->index].status;
    f->cliqueId = fabric[d->index].state ? 1 : 0;
    f->state = (unsigned)fabric[d->index].state;
    return OK;
}
/* The versioned call: v2 adds the health mask, v3 the health summary (the version word says which). */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(device_t *d, fabric_v3_t *f) {
    DEVICE(d);
    unsigned version = f->version >> 24;
    if (version < 2 || version > 3) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    cluster_uuid(d->index, f->clusterUuid);
    f->status = fabric[d->index].status;
    f->cliqueId = fabric[d->index].state ? 1 : 0;
    f->state = (unsigned)fabric[d->index].state;
    f->healthMask = fabric[d->index].mask;
    if (version == 3) f->healthSummary = fabric[d->index].state ? 1 : 0;
    return OK;
}

typedef union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } value_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec; int valueType; nvmlReturn_t nvmlReturn; value_t value; } field_value_t;
enum { VT_UINT = 1, VT_ULL = 3 };

static int field_value(const device_t *d, unsigned int id, field_value_t *v) {
    unsigned long long i = (unsigned long long)d->index;
    v->valueType = VT_ULL;
    switch (id) {
    case 3: v->value.ull = i; break;                  /* ECC SBE volatile */
    case 4: v->value.ull = 0; break;                  /* ECC DBE volatile */
    case 5: v->value.ull = 10 * i; break;             /* ECC SBE aggregate */
    case 6: v->value.ull = i == 1 ? 1 : 0; break;     /* ECC DBE aggregate */
    case 29: v->value.ull = 0; break;                 /* retired pages SBE */
    case 30: v->value.ull = 0; break;                 /* retired pages DBE */
    case 31: v->valueType = VT_UINT; v->value.ui = 0; break; /* retirement pending */
    case 82: v->valueType = VT_UINT; v->value.ui = 50 + (unsigned)i; break; /* memory temperature */
    case 83: v->value.ull = 123456789ULL + i + energy_since_load_mj(i); break;  /* energy mJ */
    /* The value types are what the H100 answered (docs/hardware.md): PCIe replays an unsigned int, the remapped
     * rows unsigned long longs. */
    case 94: v->valueType = VT_UINT; v->value.ui = 2 * (unsigned)i; break; /* PCIe replays */
    case 142: v->value.ull = i; break;                /* remapped rows, correctable */
    case 143: v->value.ull = 0; break;
    case 144: v->value.ull = 0; break;
    case 145: v->value.ull = 0; break;
    default: return 0;
    }
    return 1;
}
nvmlReturn_t nvmlDeviceGetFieldValues(device_t *d, int count, field_value_t *values) {
    DEVICE(d);
    for (int k = 0; k < count; k++) {
        field_value_t *v = &values[k];
        if (cost_model) burn_cpu(field_cost_ms(v->fieldId));
        v->timestamp = 1700000000000000LL;
        v->latencyUsec = 0;
        int unsupported_here = 0;
        for (int u = 0; u < n_unsupported_fields; u++)
            if (unsupported_fields[u] == v->fieldId) unsupported_here = 1;
        v->nvmlReturn = (!unsupported_here && field_value(d, v->fieldId, v)) ? OK : ERR_NOT_SUPPORTED;
    }
    return OK;
}

/* ---- MIG ---- */
nvmlReturn_t nvmlDeviceGetMigMode(device_t *d, unsigned int *current, unsigned int *pending) {
    DEVICE(d);
    *current = *pending = mig_count[d->index] > 0;
    return OK;
}
/* Outside MIG mode the H100 answers 0. */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(device_t *d, unsigned int *n) {
    DEVICE(d);
    *n = mig_count[d->index] > 0 ? MAX_MIG : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(device_t *d, unsigned int i, device_t **mig) {
    DEVICE(d);
    if ((int)i >= mig_count[d->index]) return ERR_NOT_FOUND;
    *mig = &migs[d->index][i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(device_t *d, unsigned int *id) {
    DEVICE(d);
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *id = (unsigned)d->index + 1;
    return OK;
}

/* MIG profiles, as nvml.h lays out nvmlGpuInstanceProfileInfo_v2_t and nvmlDeviceAttributes_t. The table is what an
 * H100 80GB HBM3 answered with MIG off (docs/hardware.md): indices 0-4, 7 and 9, NOT_SUPPORTED for the others below
 * NVML_GPU_INSTANCE_PROFILE_COUNT, INVALID_ARGUMENT from it on. A MIG device's attributes are unmeasured (MIG mode
 * cannot be switched on the lent machine): the same memory as its profile, as the driver's would be. Every MIG device
 * of the fake is a 1g.10gb. Profile index 7 (1_SLICE_REV1) is the +me variant of 1g.10gb: same slices and memory. */
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} gi_profile_t;
typedef struct { int index; unsigned int id, slices; unsigned long long mb; const char *name; } profile_row_t;
static const profile_row_t profiles[] = {
    {0, 19, 1, 9984, "MIG 1g.10gb"}, {1, 14, 2, 20096, "MIG 2g.20gb"}, {2, 9, 3, 40448, "MIG 3g.40gb"},
    {3, 5, 4, 40448, "MIG 4g.40gb"}, {4, 0, 7, 81152, "MIG 7g.80gb"}, {7, 20, 1, 9984, "MIG 1g.10gb+me"},
    {9, 15, 1, 20096, "MIG 1g.20gb"},
};
#define GPU_INSTANCE_PROFILE_COUNT 17
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(device_t *d, unsigned int profile, gi_profile_t *info) {
    DEVICE(d);
    if (d->is_mig) return ERR_INVALID_ARGUMENT;
    for (size_t k = 0; k < sizeof profiles / sizeof profiles[0]; k++) {
        if (profiles[k].index != (int)profile) continue;
        memset(info, 0, sizeof *info);
        info->version = 0x02000098; info->id = profiles[k].id; info->sliceCount = profiles[k].slices;
        info->memorySizeMB = profiles[k].mb;
        snprintf(info->name, sizeof info->name, "%s", profiles[k].name);
        return OK;
    }
    return profile < GPU_INSTANCE_PROFILE_COUNT ? ERR_NOT_SUPPORTED : ERR_INVALID_ARGUMENT;
}
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
        sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} attributes_t;
/* A whole GPU answers NOT_SUPPORTED (the H100 with MIG off did). */
nvmlReturn_t nvmlDeviceGetAttributes_v2(device_t *d, attributes_t *a) {
    DEVICE(d);
    if (!d->is_mig) return ERR_NOT_SUPPORTED;
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = 16;
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = 1;
    a->memorySizeMB = 9984;
    return OK;
}

/* ---- events (XID) ---- */
/* A set made before the fake was last configured again belongs to a collector a test has stopped (its XID thread may
 * still be in a wait, which stopping does not wait out): it gets no events, so it takes none from the next test's. */
typedef struct { int generation; } event_set_t;
typedef struct { device_t *device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } event_data_t;
nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
    ENTER();
    *set = malloc(sizeof **set);
    if (!*set) return 999; /* NVML_ERROR_UNKNOWN */
    (*set)->generation = config_generation;
    return OK;
}
nvmlReturn_t nvmlEventSetFree(event_set_t *set) { ENTER(); free(set); return OK; }
nvmlReturn_t nvmlDeviceRegisterEvents(device_t *d, unsigned long long types, event_set_t *set) { (void)types; (void)set; DEVICE(d); return OK; }
nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, event_data_t *data, unsigned int timeout_ms) {
    (void)set;
    ENTER();
    /* Like the real driver: block up to timeout_ms for an event, costing no CPU while waiting. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&lock);
    while (n_events == 0 || set->generation != config_generation)
        if (pthread_cond_timedwait(&event_queued, &lock, &deadline) != 0) break;
    if (n_events == 0 || set->generation != config_generation) { pthread_mutex_unlock(&lock); return ERR_TIMEOUT; }
    data->device = &gpus[events[0].gpu];
    data->eventType = 0x8; /* nvmlEventTypeXidCriticalError */
    data->eventData = events[0].xid;
    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
    memmove(events, events + 1, sizeof events[0] * (size_t)(--n_events));
    pthread_mutex_unlock(&lock);
    return OK;
}

/* ---- GPM (Hopper and newer): profiling metrics from two samples ---- */
typedef struct { unsigned int version; unsigned int isSupportedDevice; } gpm_support_t;
typedef struct { int device; unsigned int gpu_instance; unsigned long long taken; } gpm_sample_t;
typedef struct { char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; metric_info_t metricInfo; } gpm_metric_t;
#define GPM_METRIC_MAX 477
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample_t *sample1, *sample2;
    gpm_metric_t metrics[GPM_METRIC_MAX];
} gpm_metrics_get_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(device_t *d, gpm_support_t *support) {
    DEVICE(d);
    support->isSupportedDevice = (unsigned)gpm_supported[d->index];
    return OK;
}
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **sample) {
    ENTER();
    *sample = calloc(1, sizeof **sample);
    return *sample ? OK : ERR_UNKNOWN;
}
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *sample) { ENTER(); free(sample); return OK; }
static void take_sample(gpm_sample_t *sample, int device, unsigned int gpu_instance) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    sample->device = device;
    sample->gpu_instance = gpu_instance;
    sample->taken = (unsigned long long)now.tv_sec * 1000000000ULL + (unsigned long long)now.tv_nsec;
}
nvmlReturn_t nvmlGpmSampleGet(device_t *d, gpm_sample_t *sample) {
    DEVICE(d);
    if (!gpm_supported[d->index]) return ERR_NOT_SUPPORTED;
    take_sample(sample, d->index, 0);
    return OK;
}
/* A MIG instance's sample (nvml.h: Hopper and later, GPU instance ids as nvmlDeviceGetGpuInstanceId gives them; the
 * fake's are 1..COUNT). Unmeasured on a real H100 in MIG mode: written from nvml.h. */
nvmlReturn_t nvmlGpmMigSampleGet(device_t *d, unsigned int gpu_instance, gpm_sample_t *sample) {
    DEVICE(d);
    if (!gpm_supported[d->index]) return ERR_NOT_SUPPORTED;
    if (gpu_instance < 1 || (int)gpu_instance > mig_count[d->index]) return ERR_INVALID_ARGUMENT;
    take_sample(sample, d->index, gpu_instance);
    return OK;
}
static int gpm_value(int gpu, unsigned int gpu_instance, unsigned int id, double *value) {
    switch (id) {
    case 1: *value = 55.0 + gpu + 5.0 * gpu_instance; return 1;  /* graphics (engine) util %: above SM util, as any
                                                                    kernel resident counts, not the SMs it fills */
    case 2: *value = 50.0 + gpu + 5.0 * gpu_instance; return 1;  /* SM util %; a MIG instance adds 5 % per id */
    case 3: *value = 25.0; return 1;            /* SM occupancy % */
    case 5: *value = 40.0; return 1;            /* any tensor % */
    case 10: *value = 30.0; return 1;           /* DRAM bandwidth % */
    case 11: *value = 5.0; return 1;            /* FP64 % */
    case 12: *value = 20.0; return 1;           /* FP32 % */
    case 13: *value = 15.0; return 1;           /* FP16 % */
    case 20: *value = 100.0 * (gpu + 1); return 1;  /* PCIe TX MiB/s */
    case 21: *value = 200.0 * (gpu + 1); return 1;  /* PCIe RX MiB/s */
    case 60: *value = 1000.0; return 1;         /* NVLink RX MiB/s */
    case 61: *value = 2000.0; return 1;         /* NVLink TX MiB/s */
    default: return 0;
    }
}
nvmlReturn_t nvmlGpmMetricsGet(gpm_metrics_get_t *request) {
    ENTER();
    if (!request->sample1 || !request->sample2 || request->numMetrics > GPM_METRIC_MAX) return ERR_INVALID_ARGUMENT;
    if (request->sample2->taken <= request->sample1->taken) return ERR_INVALID_ARGUMENT;
    if (cost_model) burn_cpu(GPM_METRIC_COST_MS * request->numMetrics);
    /* As the H100 answers samples closer than 100 ms: success, zeros, and NaN for DRAM bandwidth. */
    int too_close = request->sample2->taken - request->sample1->taken < 100000000ULL;
    for (unsigned int k = 0; k < request->numMetrics; k++) {
        gpm_metric_t *m = &request->metrics[k];
        m->nvmlReturn = gpm_value(request->sample2->device, request->sample2->gpu_instance, m->metricId, &m->value)
                            ? OK : ERR_NOT_SUPPORTED;
        if (too_close && m->nvmlReturn == OK) m->value = m->metricId == 10 ? NAN : 0.0;
    }
    return OK;
}
