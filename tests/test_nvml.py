"""The NVML collector over the real pynvml binding and the fake libnvidia-ml.so.1."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accelmon import health
from accelmon.collectors import kernel_log, nvml
from accelmon.collectors.nvml import NvmlCollector
from accelmon.exporter.runtime import Exporter, Sampler
from tests.support.checks import check, nvml_only
from tests.support.clock import ManualClock
from tests.support.exposition import text_of
from tests.support.waiting import returns_while_blocked, wait_until

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000001-0000-4000-8000-000000000000"


@pytest.fixture
def make_collector(fake_nvml, started) -> Iterator[Callable[..., NvmlCollector]]:
    def make(config: str = "", **options) -> NvmlCollector:
        fake_nvml.configure(config)
        return started(NvmlCollector(**options))

    yield make
    fake_nvml.release()


class Reading:
    """One sample of a collector, queried like a registry."""

    def __init__(self, collector: NvmlCollector) -> None:
        self.text = text_of(collector)
        self.families = list(text_string_to_metric_families(self.text))

    def value(self, metric: str, /, **labels: str) -> float | None:
        for family in self.families:
            for sample in family.samples:
                if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def names(self) -> set[str]:
        return {sample.name for family in self.families for sample in family.samples}


def test_unit_conversions(make_collector):
    reading = Reading(make_collector("gpus 2\n"))
    gpu1 = {"gpu": "1", "uuid": UUID1}
    assert reading.value("accelmon_gpu_utilization_ratio", **gpu1) == pytest.approx(0.20)  # 20 %
    assert reading.value("accelmon_gpu_memory_utilization_ratio", **gpu1) == pytest.approx(0.10)
    assert reading.value("accelmon_gpu_power_watts", **gpu1) == pytest.approx(110.5)  # 110500 mW
    assert reading.value("accelmon_gpu_power_limit_watts", **gpu1) == 700.0
    assert reading.value("accelmon_gpu_energy_joules_total", **gpu1) == pytest.approx(123456.790)  # mJ
    assert reading.value("accelmon_gpu_sm_clock_hertz", **gpu1) == 1740e6  # MHz
    assert reading.value("accelmon_gpu_memory_clock_hertz", **gpu1) == 2619e6
    assert reading.value("accelmon_gpu_sm_clock_max_hertz", **gpu1) == 1980e6
    assert reading.value("accelmon_gpu_memory_used_bytes", **gpu1) == 2 * 1024**3
    assert reading.value("accelmon_gpu_memory_total_bytes", **gpu1) == 85520809984  # an H100 80GB's (bytes)
    assert reading.value("accelmon_gpu_memory_reserved_bytes", **gpu1) == 480 * 1024**2
    assert reading.value("accelmon_gpu_memory_free_bytes", **gpu1) == 85520809984 - 480 * 1024**2 - 2 * 1024**3
    assert reading.value("accelmon_gpu_temperature_celsius", **gpu1) == 41
    assert reading.value("accelmon_gpu_memory_temperature_celsius", **gpu1) == 51
    assert reading.value("accelmon_gpu_fan_speed_ratio", **gpu1) == pytest.approx(0.31)
    assert reading.value("accelmon_gpu_decoder_utilization_ratio", **gpu1) == pytest.approx(0.02)
    assert reading.value("accelmon_gpu_power_violation_seconds_total", **gpu1) == 1.0  # ns
    assert reading.value("accelmon_gpu_thermal_violation_seconds_total", **gpu1) == 0.5
    assert reading.value("accelmon_gpu_pcie_transmit_bytes_per_second", **gpu1) == 2000 * 1024  # KiB/s
    assert reading.value("accelmon_gpu_pcie_receive_bytes_per_second", **gpu1) == 4000 * 1024
    assert reading.value("accelmon_gpu_ecc_errors_total", type="corrected", scope="aggregate", **gpu1) == 10
    assert reading.value("accelmon_gpu_ecc_errors_total", type="uncorrected", scope="aggregate", **gpu1) == 1
    assert reading.value("accelmon_gpu_remapped_rows_total", cause="correctable", **gpu1) == 1
    assert reading.value("accelmon_gpu_pcie_replays_total", **gpu1) == 2
    assert reading.value("accelmon_gpu_compute_processes", **gpu1) == 1
    assert reading.value("accelmon_gpu_performance_state", **gpu1) == 2
    assert reading.value("accelmon_gpu_clock_event_active", reason="sw_power_cap", **gpu1) == 1
    assert reading.value("accelmon_gpu_clock_event_active", reason="gpu_idle", **gpu1) == 0
    assert reading.value("accelmon_gpu_info", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:28:00.0", **gpu1) == 1


def test_lost_gpu_is_reported_while_others_keep_reporting(make_collector, fake_nvml):
    collector = make_collector("gpus 3\n")
    assert Reading(collector).value("accelmon_gpu_up", gpu="1") == 1
    fake_nvml.set_lost(1)
    reading = Reading(collector)
    assert reading.value("accelmon_gpu_up", gpu="1", uuid=UUID1) == 0
    assert reading.value("accelmon_gpu_power_watts", gpu="1") is None  # no stale values for a lost GPU
    assert reading.value("accelmon_gpu_energy_joules_total", gpu="1") is None  # nor stale slow ones
    assert reading.value("accelmon_gpu_up", gpu="0") == 1
    assert reading.value("accelmon_gpu_up", gpu="2") == 1
    assert reading.value("accelmon_gpu_power_watts", gpu="2") == pytest.approx(121.0)
    assert reading.value("accelmon_gpu_energy_joules_total", gpu="2") == pytest.approx(123456.789)
    fake_nvml.set_lost(1, False)
    back = Reading(collector)
    assert back.value("accelmon_gpu_up", gpu="1") == 1  # it came back
    assert back.value("accelmon_gpu_energy_joules_total", gpu="1") == pytest.approx(123456.789)  # read at once


def test_gpu_lost_before_start(make_collector):
    reading = Reading(make_collector("gpus 2\nlost 0\n"))
    assert reading.value("accelmon_gpu_up", gpu="0") == 0
    assert reading.value("accelmon_gpu_up", gpu="1", uuid=UUID1) == 1


def test_not_supported_is_remembered_and_not_retried(make_collector, fake_nvml):
    # No XID thread: its waits would count as calls too.
    collector = make_collector("gpus 1\nunsupported nvmlDeviceGetFanSpeed\nunsupported_field 82\n", xid_events=False)
    first = Reading(collector)
    assert first.value("accelmon_gpu_fan_speed_ratio") is None
    assert first.value("accelmon_gpu_memory_temperature_celsius") is None
    assert first.value("accelmon_gpu_temperature_celsius") == 40
    before = fake_nvml.calls()
    Reading(collector)
    per_sample = fake_nvml.calls() - before
    before = fake_nvml.calls()
    fake_nvml.configure("")  # the fake now supports it, but the collector must not ask again
    Reading(collector)
    assert fake_nvml.calls() - before == per_sample
    assert "fan" in collector.gpus[0].unsupported
    assert 82 in collector.gpus[0].unsupported_fields


def test_older_driver_falls_back_to_older_functions(make_collector):
    collector = make_collector(
        "gpus 1\nmissing nvmlDeviceGetTemperatureV\nmissing nvmlDeviceGetCurrentClocksEventReasons\n"
    )
    reading = Reading(collector)
    assert reading.value("accelmon_gpu_temperature_celsius", gpu="0") == 40
    assert reading.value("accelmon_gpu_clock_event_active", gpu="0", reason="gpu_idle") == 1
    assert {"temperature_v", "clock_events"} <= collector.gpus[0].unsupported


def test_function_missing_everywhere_drops_only_its_series(make_collector):
    reading = Reading(make_collector("gpus 1\nmissing nvmlDeviceGetBAR1MemoryInfo\n"))
    assert reading.value("accelmon_gpu_bar1_memory_used_bytes") is None
    assert reading.value("accelmon_gpu_memory_used_bytes", gpu="0") == 1024**3


def test_xid_events_are_counted(make_collector, fake_nvml):
    collector = make_collector("gpus 2\n")
    assert Reading(collector).value("accelmon_gpu_xid_events_total", gpu="1") == 0
    fake_nvml.queue_xid(1, 79)
    fake_nvml.queue_xid(1, 79)
    fake_nvml.queue_xid(0, 48)

    def counted() -> Reading | None:
        reading = Reading(collector)
        both = reading.value("accelmon_gpu_xid_events_total", gpu="1") == 2
        return reading if both and reading.value("accelmon_gpu_xid_events_total", gpu="0") else None

    reading = wait_until(counted, what="the three XID events counted")
    assert reading.value("accelmon_gpu_xid_errors_total", gpu="1", uuid=UUID1, xid="79") == 2
    assert reading.value("accelmon_gpu_xid_errors_total", gpu="0", uuid=UUID0, xid="48") == 1
    assert reading.value("accelmon_gpu_xid_events_total", gpu="1") == 2


def test_a_driver_loaded_after_the_start_is_found_at_the_next_retry(make_collector, fake_nvml):
    """NVML that does not answer at start (no driver yet) is a host without GPUs, asked again once a retry period
    (not at every sample), and the GPUs of a driver loaded meanwhile are served from the next retry on, with their
    XID events."""
    clock = ManualClock()
    collector = make_collector("gpus 2\nmissing nvmlInitWithFlags\n", retry_init_seconds=60, clock=clock)
    assert collector.hardware_answering() is False
    assert Reading(collector).value("accelmon_gpu_up", gpu="0") is None
    tried = fake_nvml.calls_of("nvmlInitWithFlags")
    fake_nvml.configure("gpus 2\n")  # the driver is loaded
    clock.now += 59
    assert Reading(collector).value("accelmon_gpu_up", gpu="0") is None
    assert fake_nvml.calls_of("nvmlInitWithFlags") == tried
    clock.now += 1
    reading = Reading(collector)
    assert fake_nvml.calls_of("nvmlInitWithFlags") == tried + 1
    assert collector.hardware_answering() is True
    assert [reading.value("accelmon_gpu_up", gpu=gpu) for gpu in ("0", "1")] == [1, 1]
    fake_nvml.queue_xid(1, 79)
    wait_until(
        lambda: Reading(collector).value("accelmon_gpu_xid_errors_total", gpu="1", xid="79") == 1,
        what="the XID of a GPU found at a retry counted",
    )


def test_mig_instances(make_collector):
    reading = Reading(make_collector("gpus 2\nmig 1 3\n"))
    assert reading.value("accelmon_gpu_mig_mode_enabled", gpu="0") == 0
    assert reading.value("accelmon_gpu_mig_mode_enabled", gpu="1") == 1
    instances = [s for f in reading.families for s in f.samples if s.name == "accelmon_gpu_mig_instance_info"]
    assert sorted(s.labels["gpu_instance_id"] for s in instances) == ["1", "2", "3"]
    assert reading.value("accelmon_gpu_mig_memory_used_bytes", gpu="1", gpu_instance_id="2") == 2 * 1024**3
    assert reading.value("accelmon_gpu_mig_memory_total_bytes", gpu="1", gpu_instance_id="2") == 10 * 1024**3


def test_hung_nvml_makes_only_its_own_data_stale(make_collector, fake_nvml):
    """A GPU call that never returns: the scrape still answers at once, and the collector shows it is stale."""
    collector = make_collector("gpus 1\n")
    sampler = Sampler(collector, interval=0.1)
    exporter = Exporter([sampler], stale_after_intervals=3)
    sampler.start()
    wait_until(lambda: sampler.state().samples >= 2, what="two samples")
    fake_nvml.configure("gpus 1\nhang nvmlDeviceGetPowerUsage\n")
    # The hang directive is read at init, so re-init through the library to arm it.
    import pynvml

    pynvml.nvmlInit()
    # Stuck inside nvmlDeviceGetPowerUsage, the sampler is overdue after 3 intervals and interval + 1 s; the scrape
    # says so, answering while the call hangs, with the last good data until it is dropped.
    stuck = 'accelmon_collector_success{collector="nvml"} 0.0\n'
    wait_until(lambda: stuck in exporter.exposition().decode(), what="the hung collector reported as failing")
    text = returns_while_blocked(lambda: exporter.exposition().decode())
    assert stuck in text and "accelmon_gpu_up" in text
    fake_nvml.release()
    pynvml.nvmlShutdown()
    wait_until(
        lambda: 'accelmon_collector_success{collector="nvml"} 1.0\n' in exporter.exposition().decode(),
        what="the collector back once the call returns",
    )
    sampler.stop()


def test_collector_can_be_sampled_from_several_threads(make_collector):
    collector = make_collector("gpus 2\n")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                Reading(collector)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_values_are_read_on_their_schedule(make_collector, fake_nvml):
    """Cheap values every sample; counters and slow values (energy: 4 ms of CPU on an H100) every slow interval,
    served from the last read in between; maximum clocks once."""
    clock = ManualClock()
    collector = make_collector("gpus 1\n", slow_interval=30.0, clock=clock, xid_events=False)
    slow_calls = ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetMigMode")
    before = {name: fake_nvml.calls_of(name) for name in (*slow_calls, "nvmlDeviceGetPowerUsage")}
    max_clock_reads = fake_nvml.calls_of("nvmlDeviceGetMaxClockInfo")

    def calls_since() -> dict[str, int]:
        return {name: fake_nvml.calls_of(name) - count for name, count in before.items()}

    readings = []
    for elapsed in (0, 1, 29):
        clock.now = 1000.0 + elapsed
        readings.append(Reading(collector))
    assert calls_since() == {
        "nvmlDeviceGetViolationStatus": 2,  # power and thermal, once
        "nvmlDeviceGetBAR1MemoryInfo": 1,
        "nvmlDeviceGetMigMode": 1,
        "nvmlDeviceGetPowerUsage": 3,  # every sample
    }
    for reading in readings:  # the counters are served from cache between reads, never missing
        assert reading.value("accelmon_gpu_energy_joules_total", gpu="0") == pytest.approx(123456.789)
        assert reading.value("accelmon_gpu_bar1_memory_total_bytes", gpu="0") == 128 * 2**30
        assert reading.value("accelmon_gpu_sm_clock_max_hertz", gpu="0") == 1980e6
    clock.now = 1030.0
    Reading(collector)
    assert calls_since()["nvmlDeviceGetViolationStatus"] == 4  # due again
    assert fake_nvml.calls_of("nvmlDeviceGetMaxClockInfo") == max_clock_reads  # read at start only


def test_each_slow_read_is_served_until_the_next(make_collector):
    """The slow values of every GPU are served from one block between reads: each read replaces its GPU's."""
    clock = ManualClock()
    collector = make_collector("gpus 2\nenergy_follows_power 1\n", slow_interval=30.0, clock=clock, xid_events=False)

    def energy(gpu: str) -> float:
        return Reading(collector).value("accelmon_gpu_energy_joules_total", gpu=gpu)

    clock.now = 1000.0
    first = (energy("0"), energy("1"))
    time.sleep(0.05)  # the fake's counters grow with its power over real time
    clock.now = 1029.0
    assert (energy("0"), energy("1")) == first  # served from the read at 1000
    clock.now = 1030.0
    later = (energy("0"), energy("1"))
    assert later[0] > first[0] and later[1] > first[1]  # both read again
    assert Reading(collector).text.count("accelmon_gpu_energy_joules_total{") == 2  # once each, however many samples


def test_gpu_lost_at_start_gets_its_identity_when_it_answers(make_collector, fake_nvml):
    """It had an empty uuid and no info or maximum clocks forever, even after it came back."""
    collector = make_collector("gpus 2\nlost 0\n", xid_events=False)
    assert Reading(collector).value("accelmon_gpu_up", gpu="0", uuid="") == 0
    fake_nvml.set_lost(0, False)
    reading = Reading(collector)
    assert reading.value("accelmon_gpu_up", gpu="0", uuid=UUID0) == 1
    assert reading.value("accelmon_gpu_info", gpu="0", uuid=UUID0, name="NVIDIA H100 80GB HBM3") == 1
    assert reading.value("accelmon_gpu_sm_clock_max_hertz", gpu="0") == 1980e6


def test_a_mig_devices_profile_is_matched_by_its_slices_and_memory():
    """The profile table of an H100 80GB: a device of 1 slice and 20 GiB is a 1g.20gb, not a 1g.10gb; one of 1 slice
    and 10 GiB is the base 1g.10gb, not its +me twin (same slices and memory, higher index); a device whose
    attributes NVML will not give has no profile (an empty label, absent to Prometheus)."""
    from types import SimpleNamespace

    from accelmon.host.nvidia import MigProfiles

    class Error(Exception):
        pass

    table = {0: (1, 9856, b"MIG 1g.10gb"), 7: (1, 9856, b"MIG 1g.10gb+me"), 9: (1, 19968, b"MIG 1g.20gb"),
             4: (7, 80896, b"MIG 7g.80gb")}  # fmt: skip
    devices = {"a": (1, 19968), "b": (1, 9856), "c": (7, 80896)}

    def profile_info(parent, index, version):
        if index not in table:
            raise Error("not supported")
        slices, memory, name = table[index]
        return SimpleNamespace(sliceCount=slices, memorySizeMB=memory, name=name)

    def attributes(mig):
        if mig not in devices:
            raise Error("no permission")
        return SimpleNamespace(gpuInstanceSliceCount=devices[mig][0], memorySizeMB=devices[mig][1])

    nvml = SimpleNamespace(
        NVMLError=Error, NVML_GPU_INSTANCE_PROFILE_COUNT=18,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info, nvmlDeviceGetAttributes_v2=attributes,
    )  # fmt: skip
    profiles = MigProfiles(nvml, parent="gpu")
    assert [profiles.name(mig, f"MIG-{mig}") for mig in ("a", "b", "c", "d")] == ["1g.20gb", "1g.10gb", "7g.80gb", ""]
    table.clear()  # read once per GPU, and once per MIG device: nothing is asked again
    assert profiles.name("a", "MIG-a") == "1g.20gb"


def test_a_gpu_slowed_mid_run_is_served_slowed(make_collector, tmp_path):
    """The fake's slow_file (the Molecule cluster slows one GPU of a running job with it): the slowed GPU's SM clock
    and power drop to 60 % and its software power cap shows, while the file lists it, and no other GPU changes."""
    slow = tmp_path / "slow"
    collector = make_collector(f"gpus 4\nslow_file {slow}\n")
    gpu3 = {"gpu": "3", "uuid": "GPU-00000003-0000-4000-8000-000000000000"}
    before = Reading(collector)
    assert before.value("accelmon_gpu_sm_clock_hertz", **gpu3) == 1710e6
    assert before.value("accelmon_gpu_clock_event_active", reason="sw_power_cap", **gpu3) == 0
    slow.write_text("3\n")
    time.sleep(1.1)  # the fake reads the file again at most once a second
    slowed = Reading(collector)
    assert slowed.value("accelmon_gpu_sm_clock_hertz", **gpu3) == 1026e6
    assert slowed.value("accelmon_gpu_power_watts", **gpu3) == pytest.approx(131.5 * 0.6)
    assert slowed.value("accelmon_gpu_clock_event_active", reason="sw_power_cap", **gpu3) == 1
    assert slowed.value("accelmon_gpu_sm_clock_hertz", gpu="2") == 1725e6
    slow.write_text("3 quiet\n")  # slowed by what lies beyond it: no clock event of its own
    time.sleep(1.1)
    quiet = Reading(collector)
    assert quiet.value("accelmon_gpu_sm_clock_hertz", **gpu3) == 1026e6
    assert quiet.value("accelmon_gpu_clock_event_active", reason="sw_power_cap", **gpu3) == 0
    slow.unlink()
    time.sleep(1.1)
    assert Reading(collector).value("accelmon_gpu_sm_clock_hertz", **gpu3) == 1710e6


@pytest.mark.parametrize(
    ("rows", "name", "verdict", "action"),
    [
        ([(nvml.ECC, ["uncorrected", "volatile"], 2)], "ecc", "failure", "reset_gpu"),
        (
            [(nvml.ECC, ["uncorrected", "aggregate"], 9), (nvml.ECC, ["uncorrected", "volatile"], 0)],
            "ecc",
            "ok",
            "none",
        ),
        ([(nvml.REMAP_FAILURE, [], 1), (nvml.REMAP_PENDING, [], 1)], "memory_repair", "failure", "hardware_service"),
        ([(nvml.REMAP_PENDING, [], 1)], "memory_repair", "warning", "reset_gpu"),
        ([(nvml.RETIRED_PENDING, [], 1)], "memory_repair", "warning", "reset_gpu"),
        ([(nvml.REMAP_PENDING, [], 0), (nvml.RETIRED_PENDING, [], 0)], "memory_repair", "ok", "none"),
        ([(nvml.CLOCK_EVENT, ["hw_power_brake_slowdown"], 1)], "slowdown", "warning", "hardware_service"),
        ([(nvml.CLOCK_EVENT, ["gpu_idle"], 1), (nvml.CLOCK_EVENT, ["sw_power_cap"], 1)], "slowdown", "ok", "none"),
        ([(nvml.XID_ERRORS, ["94"], 1)], "xid", "warning", "restart_app"),
        ([(nvml.XID_ERRORS, ["45"], 3)], "xid", "ok", "none"),  # info: a follow-on of another error
        ([(nvml.XID_ERRORS, ["31"], 1), (nvml.XID_ERRORS, ["95"], 1)], "xid", "failure", "reset_gpu"),
        ([(nvml.PCIE_WIDTH, [], 8), (nvml.PCIE_WIDTH_MAX, [], 16)], "pcie", "warning", "hardware_service"),
        (
            [(nvml.PCIE_GENERATION, [], 3), (nvml.PCIE_GENERATION_MAX, [], 5), (nvml.CLOCK_EVENT, ["gpu_idle"], 0)],
            "pcie",
            "warning",
            "hardware_service",
        ),
        # An idle GPU at Gen1 is saving power, not degraded.
        (
            [(nvml.PCIE_GENERATION, [], 1), (nvml.PCIE_GENERATION_MAX, [], 5), (nvml.CLOCK_EVENT, ["gpu_idle"], 1)],
            "pcie",
            "ok",
            "none",
        ),
        (
            [(nvml.PCIE_GENERATION, [], 5), (nvml.PCIE_GENERATION_MAX, [], 5), (nvml.PCIE_WIDTH, [], 16)],
            "pcie",
            "ok",
            "none",
        ),
    ],
)
def test_the_device_checks_on_nvml_samples(rows, name, verdict, action):
    """The GPU device checks (accelmon.health.gpu_metrics, declared by nvml) and the xid check over NVML's XID
    events."""
    node = health.evaluate([nvml_only(rows)], now=0, registrations=[kernel_log.REGISTRATION, nvml.REGISTRATION])
    found = check(node, "0", name)
    assert (found.verdict, found.action) == (verdict, action), found
