/*
 * A fake libamd_smi.so for accelmon's tests: it answers the amdsmi calls the `amdsmi` collector makes, through
 * AMD's real `amdsmi` Python bindings (the pinned 7.0.2, whose ctypes layer loads this library), with
 * deterministic values derived from the GPU index. Written from the public amdsmi API (amdsmi.h of ROCm 7.0.2):
 * the structures below keep that header's layout for the fields they name and pad the rest; the test
 * test_the_fake_keeps_the_bindings_struct_layouts compares their sizes with the bindings' ctypes structures.
 * Every other entry point the bindings bind is a generated stub that answers AMDSMI_STATUS_NOT_SUPPORTED
 * (tests/support/fakeamdsmi.py), as a real library answers for a field a GPU model lacks.
 *
 * Configured by the file named in $FAKE_AMDSMI_CONFIG, read at every amdsmi_init; one directive per line:
 *   gpus N                         number of GPUs (default 2; one socket each, as MI300X OAM modules)
 *   name TEXT                      market name (default "AMD Instinct MI300X")
 *   lost I                         GPU I answers AMDSMI_STATUS_NOT_FOUND to every call (fell off the bus)
 *   unsupported FUNC               FUNC answers AMDSMI_STATUS_NOT_SUPPORTED (every GPU)
 *   ecc I BLOCK C U D              GPU I's RAS block BLOCK (its amdsmi_gpu_block_t value: 1 UMC, 2 SDMA, 4 GFX,
 *                                  ...) counted C correctable, U uncorrectable and D deferred errors
 *   throttle I MASK                GPU I's gpu_metrics indep_throttle_status (bits: docs/amd.md)
 *   pcie I SPEED_MTS WIDTH         GPU I's PCIe link now (default 32000 MT/s, x16: Gen5, the maximum)
 *   xgmi_down I L                  GPU I's XGMI link L is down (default: links 0-6 up, 7 absent, as an 8-GPU MI300X
 *                                  platform where each GPU links to its 7 peers)
 *   xgmi_error I STATUS            GPU I's XGMI error status (0 none, 1 an error, 2 several)
 *   partition COMPUTE MEMORY       compute and memory partition modes (default SPX NPS1)
 * Values: GFX activity 10 % x (index + 1) mod 100, UMC activity 5 % x (index + 1), VRAM 192 GiB with (index + 1)
 * GiB used, socket power 300 + 10 x index W of a 750 W cap, temperatures edge 40, hotspot 50, VRAM 45 (+ index),
 * GFX clock 1500 + 10 x index of 2100 MHz, memory clock 1300 of 1300 MHz, PCIe replays 3 x index, energy
 * accumulating at the socket power in 15.259 uJ steps. Call costs: unmeasured (no AMD GPU was lent, docs/amd.md).
 * Test helpers (not amdsmi): fakeAmdSmiCallsOf(name) (since the last amdsmi_init), fakeAmdSmiSetLost(i, lost), fakeAmdSmiSizeOf(name).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint32_t amdsmi_status_t;
enum { OK = 0, INVAL = 1, NOT_SUPPORTED = 2, NOT_FOUND = 31, NOT_INIT = 32, INSUFFICIENT_SIZE = 41 };
#define MAX_GPUS 16
#define MAX_NAMES 32
#define MAX_BLOCKS 19
#define XGMI_LINKS 8
#define U16_NA 0xFFFF

/* amdsmi.h's structures, for the fields used; `reserved` arrays keep their sizes. */
typedef union { uint64_t as_uint; } amdsmi_bdf_t;
typedef struct {
    char market_name[256]; uint32_t vendor_id; char vendor_name[256]; uint32_t subvendor_id; uint64_t device_id;
    uint32_t rev_id; char asic_serial[256]; uint32_t oam_id; uint32_t num_of_compute_units;
    uint64_t target_graphics_version; uint32_t subsystem_id; uint32_t reserved[21];
} amdsmi_asic_info_t;
typedef struct { uint32_t gfx_activity, umc_activity, mm_activity, reserved[13]; } amdsmi_engine_usage_t;
typedef struct {
    uint64_t socket_power; uint32_t current_socket_power, average_socket_power;
    uint64_t gfx_voltage, soc_voltage, mem_voltage; uint32_t power_limit; uint64_t reserved[18];
} amdsmi_power_info_t;
typedef struct {
    uint64_t power_cap, default_power_cap, dpm_cap, min_power_cap, max_power_cap, reserved[3];
} amdsmi_power_cap_info_t;
typedef struct {
    uint32_t clk, min_clk, max_clk; uint8_t clk_locked, clk_deep_sleep; uint32_t reserved[4];
} amdsmi_clk_info_t;
typedef struct { uint64_t correctable_count, uncorrectable_count, deferred_count, reserved[5]; } amdsmi_error_count_t;
typedef struct {
    struct {
        uint16_t max_pcie_width; uint32_t max_pcie_speed, pcie_interface_version, slot_type,
            max_pcie_interface_version; uint64_t reserved[9];
    } pcie_static;
    struct {
        uint16_t pcie_width; uint32_t pcie_speed, pcie_bandwidth; uint64_t pcie_replay_count,
            pcie_l0_to_recovery_count, pcie_replay_roll_over_count, pcie_nak_sent_count, pcie_nak_received_count;
        uint32_t pcie_lc_perf_other_end_recovery_count; uint64_t reserved[12];
    } pcie_metric;
    uint64_t reserved[32];
} amdsmi_pcie_info_t;
typedef struct { char driver_version[256], driver_date[256], driver_name[256]; } amdsmi_driver_info_t;
typedef struct { char name[256], build_date[256], part_number[256], version[256]; uint64_t reserved[68]; }
    amdsmi_vbios_info_t;
typedef struct { uint32_t major, minor, release; const char *build; } amdsmi_version_t;
typedef struct {
    uint32_t gfx_busy_inst[8]; uint16_t jpeg_busy[40], vcn_busy[4]; uint64_t gfx_busy_acc[8],
        gfx_below_host_limit_acc[8], gfx_below_host_limit_ppt_acc[8], gfx_below_host_limit_thm_acc[8],
        gfx_low_utilization_acc[8], gfx_below_host_limit_total_acc[8];
} amdsmi_gpu_xcp_metrics_t;
typedef struct {
    struct { uint16_t structure_size; uint8_t format_revision, content_revision; } common_header;
    uint16_t temperature_edge, temperature_hotspot, temperature_mem, temperature_vrgfx, temperature_vrsoc,
        temperature_vrmem, average_gfx_activity, average_umc_activity, average_mm_activity, average_socket_power;
    uint64_t energy_accumulator, system_clock_counter;
    uint16_t average_clocks[7], current_clocks[7];
    uint32_t throttle_status;
    uint16_t current_fan_speed, pcie_link_width, pcie_link_speed;
    uint32_t gfx_activity_acc, mem_activity_acc;
    uint16_t temperature_hbm[4];
    uint64_t firmware_timestamp;
    uint16_t voltage_soc, voltage_gfx, voltage_mem;
    uint64_t indep_throttle_status;
    uint16_t current_socket_power, vcn_activity[4];
    uint32_t gfxclk_lock_status;
    uint16_t xgmi_link_width, xgmi_link_speed;
    uint64_t pcie_bandwidth_acc, pcie_bandwidth_inst, pcie_l0_to_recov_count_acc, pcie_replay_count_acc,
        pcie_replay_rover_count_acc, xgmi_read_data_acc[XGMI_LINKS], xgmi_write_data_acc[XGMI_LINKS];
    uint16_t current_gfxclks[8], current_socclks[4], current_vclk0s[4], current_dclk0s[4], jpeg_activity[32];
    uint32_t pcie_nak_sent_count_acc, pcie_nak_rcvd_count_acc;
    uint64_t accumulation_counter, prochot_residency_acc, ppt_residency_acc, socket_thm_residency_acc,
        vr_thm_residency_acc, hbm_thm_residency_acc;
    uint16_t num_partition;
    amdsmi_gpu_xcp_metrics_t xcp_stats[8];
    uint32_t pcie_lc_perf_other_end_recovery;
    uint64_t vram_max_bandwidth;
    uint16_t xgmi_link_status[XGMI_LINKS];
} amdsmi_gpu_metrics_t;

typedef struct { int index; } gpu_t;

static gpu_t gpus[MAX_GPUS];
static int gpu_count = 2;
static char market_name[128] = "AMD Instinct MI300X";
static int lost[MAX_GPUS];
static char unsupported[MAX_NAMES][64];
static int n_unsupported;
static uint64_t ecc[MAX_GPUS][MAX_BLOCKS][3];
static uint64_t throttle[MAX_GPUS];
static uint32_t pcie_speed[MAX_GPUS];
static uint16_t pcie_width[MAX_GPUS];
static int xgmi_down[MAX_GPUS][XGMI_LINKS];
static uint32_t xgmi_error[MAX_GPUS];
static char compute_partition[16] = "SPX";
static char memory_partition[16] = "NPS1";
static struct timespec started;

static struct { char name[64]; unsigned long long count; } calls[64];
static int n_calls;

static void count(const char *name) {
    for (int i = 0; i < n_calls; i++)
        if (strcmp(calls[i].name, name) == 0) { calls[i].count++; return; }
    if (n_calls < 64) { snprintf(calls[n_calls].name, 64, "%s", name); calls[n_calls++].count = 1; }
}

unsigned long long fakeAmdSmiCallsOf(const char *name) {
    for (int i = 0; i < n_calls; i++)
        if (strcmp(calls[i].name, name) == 0) return calls[i].count;
    return 0;
}

void fakeAmdSmiSetLost(int index, int is_lost) {
    if (index >= 0 && index < MAX_GPUS) lost[index] = is_lost;
}

/* The size of one of the structures above, by its amdsmi name (0: unknown), for the layout test. */
unsigned long fakeAmdSmiSizeOf(const char *name) {
#define SIZE(type) if (strcmp(name, #type) == 0) return sizeof(type)
    SIZE(amdsmi_asic_info_t); SIZE(amdsmi_engine_usage_t); SIZE(amdsmi_power_info_t);
    SIZE(amdsmi_power_cap_info_t); SIZE(amdsmi_clk_info_t); SIZE(amdsmi_error_count_t); SIZE(amdsmi_pcie_info_t);
    SIZE(amdsmi_driver_info_t); SIZE(amdsmi_vbios_info_t); SIZE(amdsmi_version_t); SIZE(amdsmi_gpu_metrics_t);
#undef SIZE
    return 0;
}

static void reset(void) {
    gpu_count = 2;
    snprintf(market_name, sizeof market_name, "%s", "AMD Instinct MI300X");
    memset(lost, 0, sizeof lost);
    n_unsupported = 0;
    memset(ecc, 0, sizeof ecc);
    memset(throttle, 0, sizeof throttle);
    memset(xgmi_down, 0, sizeof xgmi_down);
    memset(xgmi_error, 0, sizeof xgmi_error);
    for (int i = 0; i < MAX_GPUS; i++) { pcie_speed[i] = 32000; pcie_width[i] = 16; }
    snprintf(compute_partition, sizeof compute_partition, "SPX");
    snprintf(memory_partition, sizeof memory_partition, "NPS1");
}

static int block_slot(uint64_t block) {
    for (int slot = 0; slot < MAX_BLOCKS; slot++)
        if (block == (1ULL << slot)) return slot;
    return -1;
}

/* still 1: the counters that grow with time (energy, XGMI bytes) stay at their start values, so that a golden
   exposition is the same from run to run; the default lets them grow, as a real GPU's do. */
static int still;

static void read_config(void) {
    reset();
    still = 0;
    const char *path = getenv("FAKE_AMDSMI_CONFIG");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file) return;
    char line[256];
    while (fgets(line, sizeof line, file)) {
        int i, a, b;
        unsigned long long c, u, d, block;
        char word[64], other[64];
        if (sscanf(line, "gpus %d", &a) == 1 && a >= 0 && a <= MAX_GPUS) gpu_count = a;
        else if (sscanf(line, "name %127[^\n]", market_name) == 1) continue;
        else if (sscanf(line, "lost %d", &i) == 1 && i >= 0 && i < MAX_GPUS) lost[i] = 1;
        else if (sscanf(line, "unsupported %63s", word) == 1 && n_unsupported < MAX_NAMES)
            snprintf(unsupported[n_unsupported++], 64, "%s", word);
        else if (sscanf(line, "ecc %d %llu %llu %llu %llu", &i, &block, &c, &u, &d) == 5 && i >= 0 && i < MAX_GPUS
                 && block_slot(block) >= 0) {
            ecc[i][block_slot(block)][0] = c; ecc[i][block_slot(block)][1] = u; ecc[i][block_slot(block)][2] = d;
        } else if (sscanf(line, "throttle %d %llu", &i, &c) == 2 && i >= 0 && i < MAX_GPUS) throttle[i] = c;
        else if (sscanf(line, "pcie %d %d %d", &i, &a, &b) == 3 && i >= 0 && i < MAX_GPUS) {
            pcie_speed[i] = (uint32_t)a; pcie_width[i] = (uint16_t)b;
        } else if (sscanf(line, "xgmi_down %d %d", &i, &a) == 2 && i >= 0 && i < MAX_GPUS && a >= 0 && a < XGMI_LINKS)
            xgmi_down[i][a] = 1;
        else if (sscanf(line, "xgmi_error %d %d", &i, &a) == 2 && i >= 0 && i < MAX_GPUS) xgmi_error[i] = (uint32_t)a;
        else if (sscanf(line, "still %d", &a) == 1) still = a;
        else if (sscanf(line, "partition %15s %15s", word, other) == 2) {
            snprintf(compute_partition, sizeof compute_partition, "%s", word);
            snprintf(memory_partition, sizeof memory_partition, "%s", other);
        }
    }
    fclose(file);
}

static int is_unsupported(const char *name) {
    for (int i = 0; i < n_unsupported; i++)
        if (strcmp(unsupported[i], name) == 0) return 1;
    return 0;
}

static double seconds_since_start(void) {
    if (still) return 0.0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
}

/* Every GPU entry point starts here: counts the call, then refuses an unknown handle, a lost GPU or an
 * unsupported function. */
#define ENTER(handle)                                                                                  \
    count(__func__);                                                                                   \
    gpu_t *gpu = (gpu_t *)(handle);                                                                    \
    if (gpu < gpus || gpu >= gpus + gpu_count) return INVAL;                                           \
    if (lost[gpu->index]) return NOT_FOUND;                                                            \
    if (is_unsupported(__func__)) return NOT_SUPPORTED;                                                \
    int index = gpu->index;                                                                            \
    (void)index

amdsmi_status_t amdsmi_init(uint64_t flags) {
    (void)flags;
    n_calls = 0;  /* call counts start again: fakeAmdSmiCallsOf counts since the last amdsmi_init */
    count(__func__);
    read_config();
    for (int i = 0; i < MAX_GPUS; i++) gpus[i].index = i;
    clock_gettime(CLOCK_MONOTONIC, &started);
    return OK;
}

amdsmi_status_t amdsmi_shut_down(void) { count(__func__); return OK; }

amdsmi_status_t amdsmi_get_lib_version(amdsmi_version_t *version) {
    count(__func__);
    version->major = 26; version->minor = 0; version->release = 2; version->build = "fake";
    return OK;
}

/* One socket per GPU: a socket handle is its GPU's. */
amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, void **handles) {
    count(__func__);
    if (!handles) { *socket_count = (uint32_t)gpu_count; return OK; }
    if (*socket_count < (uint32_t)gpu_count) return INSUFFICIENT_SIZE;
    for (int i = 0; i < gpu_count; i++) handles[i] = &gpus[i];
    *socket_count = (uint32_t)gpu_count;
    return OK;
}

amdsmi_status_t amdsmi_get_processor_handles(void *socket, uint32_t *processor_count, void **handles) {
    count(__func__);
    if (!handles) { *processor_count = 1; return OK; }
    handles[0] = socket;
    *processor_count = 1;
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_device_uuid(void *handle, uint32_t *length, char *uuid) {
    ENTER(handle);
    snprintf(uuid, *length, "%02xff74a1-0000-1000-80%02x-00000000%04x", index, index, 0x1000 + index);
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_device_bdf(void *handle, amdsmi_bdf_t *bdf) {
    ENTER(handle);
    uint64_t bus = 0x11 + 0x10 * (uint64_t)index;  /* 0000:11:00.0, 0000:21:00.0, ... */
    bdf->as_uint = bus << 8;  /* function 3 bits, device 5 bits, bus 8 bits, domain 48 bits */
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_asic_info(void *handle, amdsmi_asic_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    snprintf(info->market_name, sizeof info->market_name, "%s", market_name);
    snprintf(info->vendor_name, sizeof info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    snprintf(info->asic_serial, sizeof info->asic_serial, "0x%016llX", 0x5E1D000000000000ULL + (unsigned)index);
    info->vendor_id = 0x1002; info->subvendor_id = 0x1002; info->device_id = 0x74a1; info->rev_id = 0;
    info->oam_id = (uint32_t)index; info->num_of_compute_units = 304; info->target_graphics_version = 0x942;
    info->subsystem_id = 0x74a1;
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_driver_info(void *handle, amdsmi_driver_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    snprintf(info->driver_version, 256, "6.12.12");
    snprintf(info->driver_date, 256, "2015/01/01 00:00");
    snprintf(info->driver_name, 256, "amdgpu");
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_vbios_info(void *handle, amdsmi_vbios_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    snprintf(info->name, 256, "AMD MI300X_HW_SRIOV_CVS_1VF");
    snprintf(info->part_number, 256, "113-M3000100-102");
    snprintf(info->version, 256, "022.040.003.043.000001");
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_activity(void *handle, amdsmi_engine_usage_t *usage) {
    ENTER(handle);
    memset(usage, 0, sizeof *usage);
    usage->gfx_activity = (uint32_t)((10 * (index + 1)) % 100);
    usage->umc_activity = (uint32_t)(5 * (index + 1));
    usage->mm_activity = 0;
    return OK;
}

static const uint64_t VRAM_TOTAL = 192ULL << 30;

amdsmi_status_t amdsmi_get_gpu_memory_total(void *handle, uint32_t type, uint64_t *total) {
    ENTER(handle);
    if (type != 0) return NOT_SUPPORTED;  /* VRAM only */
    *total = VRAM_TOTAL;
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_memory_usage(void *handle, uint32_t type, uint64_t *used) {
    ENTER(handle);
    if (type != 0) return NOT_SUPPORTED;
    *used = (uint64_t)(index + 1) << 30;
    return OK;
}

static uint64_t socket_power(int index) { return 300 + 10 * (uint64_t)index; }

amdsmi_status_t amdsmi_get_power_info(void *handle, amdsmi_power_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    info->socket_power = socket_power(index);
    info->current_socket_power = (uint32_t)socket_power(index);
    info->average_socket_power = U16_NA;  /* MI300 reports the current power only */
    info->gfx_voltage = info->soc_voltage = info->mem_voltage = U16_NA;
    info->power_limit = 750;
    return OK;
}

amdsmi_status_t amdsmi_get_power_cap_info(void *handle, uint32_t sensor, amdsmi_power_cap_info_t *info) {
    ENTER(handle);
    (void)sensor;
    memset(info, 0, sizeof *info);
    info->power_cap = info->default_power_cap = info->max_power_cap = 750000000ULL;  /* microwatts */
    info->min_power_cap = 0;
    return OK;
}

static const float ENERGY_RESOLUTION_UJ = 15.259f;

amdsmi_status_t amdsmi_get_energy_count(void *handle, uint64_t *energy, float *resolution, uint64_t *timestamp) {
    ENTER(handle);
    double joules = 1e6 + (double)socket_power(index) * seconds_since_start();
    *resolution = ENERGY_RESOLUTION_UJ;
    *energy = (uint64_t)(joules * 1e6 / ENERGY_RESOLUTION_UJ);
    *timestamp = (uint64_t)(seconds_since_start() * 1e9);
    return OK;
}

amdsmi_status_t amdsmi_get_temp_metric(void *handle, uint32_t sensor, uint32_t metric, int64_t *value) {
    ENTER(handle);
    if (metric != 0) return NOT_SUPPORTED;  /* AMDSMI_TEMP_CURRENT only */
    switch (sensor) {
    case 0: *value = 40 + index; return OK;  /* edge */
    case 1: *value = 50 + index; return OK;  /* hotspot (junction) */
    case 2: *value = 45 + index; return OK;  /* VRAM */
    default: return NOT_SUPPORTED;
    }
}

amdsmi_status_t amdsmi_get_clock_info(void *handle, uint32_t type, amdsmi_clk_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    if (type == 0) { info->clk = 1500 + 10 * (uint32_t)index; info->min_clk = 500; info->max_clk = 2100; }
    else if (type == 4) { info->clk = 1300; info->min_clk = 900; info->max_clk = 1300; }
    else return NOT_SUPPORTED;
    info->clk_locked = 0xFF; info->clk_deep_sleep = 0;
    return OK;
}

/* Blocks with RAS on, as an MI300X reports them: UMC, SDMA, GFX, MMHUB, PCIE_BIF, HDP, XGMI_WAFL. */
static const uint64_t RAS_ENABLED = 1 | 2 | 4 | 8 | 32 | 64 | 128;

amdsmi_status_t amdsmi_get_gpu_ras_block_features_enabled(void *handle, uint64_t block, uint32_t *state) {
    ENTER(handle);
    *state = (block & RAS_ENABLED) ? 6 : 1;  /* AMDSMI_RAS_ERR_STATE_ENABLED : _DISABLED */
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_ecc_count(void *handle, uint64_t block, amdsmi_error_count_t *counts) {
    ENTER(handle);
    int slot = block_slot(block);
    if (slot < 0 || !(block & RAS_ENABLED)) return NOT_SUPPORTED;
    memset(counts, 0, sizeof *counts);
    counts->correctable_count = ecc[index][slot][0];
    counts->uncorrectable_count = ecc[index][slot][1];
    counts->deferred_count = ecc[index][slot][2];
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_total_ecc_count(void *handle, amdsmi_error_count_t *counts) {
    ENTER(handle);
    memset(counts, 0, sizeof *counts);
    for (int slot = 0; slot < MAX_BLOCKS; slot++) {
        counts->correctable_count += ecc[index][slot][0];
        counts->uncorrectable_count += ecc[index][slot][1];
        counts->deferred_count += ecc[index][slot][2];
    }
    return OK;
}

amdsmi_status_t amdsmi_get_pcie_info(void *handle, amdsmi_pcie_info_t *info) {
    ENTER(handle);
    memset(info, 0, sizeof *info);
    info->pcie_static.max_pcie_width = 16;
    info->pcie_static.max_pcie_speed = 32000;
    info->pcie_static.pcie_interface_version = 5;
    info->pcie_static.max_pcie_interface_version = 5;
    info->pcie_static.slot_type = 2;  /* OAM */
    info->pcie_metric.pcie_width = pcie_width[index];
    info->pcie_metric.pcie_speed = pcie_speed[index];
    info->pcie_metric.pcie_bandwidth = 0;
    info->pcie_metric.pcie_replay_count = 3 * (uint64_t)index;
    info->pcie_metric.pcie_l0_to_recovery_count = (uint64_t)index;
    info->pcie_metric.pcie_replay_roll_over_count = 0;
    info->pcie_metric.pcie_nak_sent_count = info->pcie_metric.pcie_nak_received_count = 0;
    info->pcie_metric.pcie_lc_perf_other_end_recovery_count = 0;
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_metrics_info(void *handle, amdsmi_gpu_metrics_t *metrics) {
    ENTER(handle);
    memset(metrics, 0xFF, sizeof *metrics);  /* what the GPU does not report reads as all ones (N/A) */
    metrics->common_header.structure_size = (uint16_t)sizeof *metrics;
    metrics->common_header.format_revision = 1;
    metrics->common_header.content_revision = 6;  /* gpu_metrics v1.6, an MI300X's */
    metrics->temperature_hotspot = (uint16_t)(50 + index);
    metrics->temperature_mem = (uint16_t)(45 + index);
    metrics->average_gfx_activity = (uint16_t)((10 * (index + 1)) % 100);
    metrics->average_umc_activity = (uint16_t)(5 * (index + 1));
    metrics->current_socket_power = (uint16_t)socket_power(index);
    metrics->throttle_status = throttle[index] ? 1 : 0;
    metrics->indep_throttle_status = throttle[index];
    metrics->pcie_link_width = pcie_width[index];
    metrics->pcie_link_speed = (uint16_t)(pcie_speed[index] / 100);  /* 0.1 GT/s */
    metrics->xgmi_link_width = 16;
    metrics->xgmi_link_speed = 32;  /* Gbps */
    double seconds = seconds_since_start();
    for (int link = 0; link < XGMI_LINKS; link++) {
        if (link == XGMI_LINKS - 1) continue;  /* an 8-GPU platform: 7 peers */
        metrics->xgmi_link_status[link] = xgmi_down[index][link] ? 0 : 1;
        /* KB moved: 1 GB/s per link while up, from 1 GB at start */
        uint64_t kilobytes = 1000000 + (xgmi_down[index][link] ? 0 : (uint64_t)(seconds * 1e6));
        metrics->xgmi_read_data_acc[link] = kilobytes;
        metrics->xgmi_write_data_acc[link] = kilobytes / 2;
    }
    metrics->num_partition = 1;
    return OK;
}

amdsmi_status_t amdsmi_gpu_xgmi_error_status(void *handle, uint32_t *status) {
    ENTER(handle);
    *status = xgmi_error[index];
    return OK;
}

static amdsmi_status_t partition(const char *mode, char *out, uint32_t length) {
    if (length <= strlen(mode)) return INSUFFICIENT_SIZE;
    snprintf(out, length, "%s", mode);
    return OK;
}

amdsmi_status_t amdsmi_get_gpu_compute_partition(void *handle, char *out, uint32_t length) {
    ENTER(handle);
    return partition(compute_partition, out, length);
}

amdsmi_status_t amdsmi_get_gpu_memory_partition(void *handle, char *out, uint32_t length) {
    ENTER(handle);
    return partition(memory_partition, out, length);
}
