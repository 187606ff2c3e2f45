"""DCGM's health watches through the fake DCGM bindings (tests/fakedcgm): incidents per GPU and system, held for a
while, messages to the log only, the host engine going away and coming back; and the health check over them."""

from __future__ import annotations

import logging

import pytest

from accelmon import health
from accelmon.collectors import dcgm_health, nvml
from accelmon.collectors.dcgm_health import STATE, DcgmHealthCollector
from accelmon.exporter.metrics import Samples
from tests.support.clock import ManualClock
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.paths import FAKE_DCGM_BINDINGS

# The collectors whose checks these tests judge (a check runs only where its collector does).
CHECKED = [dcgm_health.REGISTRATION, nvml.REGISTRATION]  # NVML lists the GPUs

FAKE_DCGM = str(FAKE_DCGM_BINDINGS)
MEM, NVLINK, THERMAL = 0x10, 0x2, 0x80
UUID0 = "GPU-00000000-0000-4000-8000-000000000000"


@pytest.fixture
def dcgm(fake_dcgm):
    fake_dcgm(up=True, gpus=[0, 1])
    return fake_dcgm


def collector(clock: ManualClock) -> DcgmHealthCollector:
    made = DcgmHealthCollector(bindings_paths=(FAKE_DCGM,), hold_seconds=600, clock=clock)
    made.start()
    return made


def read(made: DcgmHealthCollector) -> str:
    return text_of(made)


def test_incidents_per_gpu_and_system_are_held_then_dropped(dcgm, caplog):
    clock = ManualClock()
    made = collector(clock)
    text = read(made)
    assert sample_value(text, "accelmon_dcgm_health_up") == 1
    assert sample_value(text, "accelmon_gpu_dcgm_health_state", gpu="0", uuid=UUID0, system="mem") == 0
    message = "Detected 2 double-bit ECC errors for GPU 0."
    dcgm(
        up=True,
        gpus=[0, 1],
        incidents=[
            {"gpu": 0, "system": MEM, "health": 20, "code": 28, "msg": message},
            {"gpu": 1, "system": THERMAL, "health": 10, "code": 45, "msg": "Clocks throttled: thermal."},
            {"gpu": 0, "system": 0x2, "health": 10, "code": 19, "group": 3, "msg": "a switch: not a GPU"},
        ],
    )
    with caplog.at_level(logging.WARNING, logger="accelmon.dcgm_health"):
        text = read(made)
        read(made)  # the same incidents again: logged once
    promtool_check(text)
    assert sample_value(text, "accelmon_gpu_dcgm_health_state", gpu="0", system="mem") == 2
    assert sample_value(text, "accelmon_gpu_dcgm_health_state", gpu="1", system="thermal") == 1
    assert sample_value(text, "accelmon_gpu_dcgm_health_state", gpu="0", system="nvlink") == 0  # the switch's
    assert sample_value(text, "accelmon_gpu_dcgm_health_incident", gpu="0", system="mem", code="28") == 2
    assert message not in text  # free text stays out of labels
    assert [r.getMessage() for r in caplog.records].count(f"DCGM: GPU 0 mem failure: {message}") == 1
    dcgm(up=True, gpus=[0, 1])  # DCGM reports nothing new: held for hold_seconds
    clock.now += 300
    assert sample_value(read(made), "accelmon_gpu_dcgm_health_state", gpu="0", system="mem") == 2
    clock.now += 400
    assert sample_value(read(made), "accelmon_gpu_dcgm_health_state", gpu="0", system="mem") == 0
    made.stop()


def test_a_host_engine_that_goes_away_is_reported_and_reconnected(dcgm):
    made = collector(ManualClock())
    assert sample_value(read(made), "accelmon_dcgm_health_up") == 1
    dcgm(up=False)
    text = read(made)
    assert sample_value(text, "accelmon_dcgm_health_up") == 0
    assert "accelmon_gpu_dcgm_health_state{" not in text  # no stale verdicts
    dcgm(up=True, gpus=[0])
    assert sample_value(read(made), "accelmon_gpu_dcgm_health_state", gpu="0", system="pcie") == 0
    made.stop()


def test_without_bindings_the_collector_says_so(tmp_path):
    made = DcgmHealthCollector(bindings_paths=(str(tmp_path),))
    made.start()
    assert sample_value(read(made), "accelmon_dcgm_health_up") == 0
    assert not made.hardware_answering()


@pytest.mark.parametrize(
    ("states", "verdict", "action", "detail"),
    [
        ({"mem": 0, "nvlink": 0}, "ok", "none", "DCGM: 2 systems pass"),
        ({"mem": 2, "nvlink": 1}, "failure", "reset_gpu", "DCGM health failure: mem"),
        ({"nvlink": 1, "thermal": 1}, "warning", "hardware_service", "DCGM health warning: nvlink, thermal"),
        ({"driver": 2, "pcie": 2}, "failure", "hardware_service", "DCGM health failure: driver, pcie"),
    ],
)
def test_the_dcgm_check(states, verdict, action, detail):
    samples = Samples()
    samples.add(nvml.UP, ["0", "GPU-a"], 1)
    for system, state in states.items():
        samples.add(STATE, ["0", "GPU-a", system], state)
    found = next(c for c in health.evaluate([samples], now=0, registrations=CHECKED).gpus[0].checks if c.name == "dcgm")
    assert (found.verdict, found.action, found.detail) == (verdict, action, detail)


def test_golden(dcgm):
    dcgm(up=True, gpus=[0, 1], incidents=[{"gpu": 0, "system": MEM, "health": 20, "code": 28, "msg": "2 DBE"}])
    made = collector(ManualClock())
    text = read(made)
    made.stop()
    promtool_check(text)
    check_golden("dcgm_health_incident.prom", text)
