"""The job report's analysis and rendering as pure functions of a tidy table, without Prometheus: the summary's
figures, findings, stragglers, what is said where nothing was measured, and the summary's JSON."""

from __future__ import annotations

import json

import pytest

pd = pytest.importorskip("pandas")  # the `report` extra: absent from the Python 3.9 unit run's venv
pytest.importorskip("jinja2")

from accelmon import report  # noqa: E402 (after the extra is known to be there)
from accelmon.report import MAX_POINTS, step_for  # noqa: E402
from accelmon.report.cli import without_float_noise  # noqa: E402
from accelmon.report.render import energy_line, owner  # noqa: E402
from accelmon.report.thresholds import Thresholds  # noqa: E402


def frame_of(rows: list[dict]) -> object:
    frame = pd.DataFrame(rows)
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    return frame


def gpu_rows(values: dict[tuple[str, str], list[float]], metric: str = "utilization", step: float = 30.0) -> list:
    """Rows of one GPU metric: {(node, uuid): [value at each step]}."""
    return [
        {"time": i * step, "node": node, "gpu": uuid[-1], "uuid": uuid, "metric": metric, "value": value}
        for (node, uuid), series in values.items()
        for i, value in enumerate(series)
    ]


def test_html_escapes_what_job_records_say():
    summary = json.loads(
        json.dumps({**_minimal_summary(), "user": "<script>alert(1)</script>", "account": "a&b"})
    )  # what a hostile prolog environment could put in a record
    page = report.html(summary, [], "http://127.0.0.1:9090")
    assert "<script>alert" not in page and "&lt;script&gt;" in page and "a&amp;b" in page


def _minimal_summary() -> dict:
    return {
        "job_id": "1", "user": "", "account": "", "nodes": [], "gpus": [], "start": "", "end": "",
        "duration_seconds": 60.0, "step_seconds": 1.0, "gpu_utilization_mean": None, "sm_active_mean": None,
        "gpu_memory_peak_ratio": None, "energy_joules": 0.0, "energy_kwh": 0.0, "gpu_hours_allocated": 0.0,
        "gpu_hours_idle": 0.0, "node_summary": [], "stragglers": [], "cpu_efficiency": None,
        "cpu_energy_joules": None, "total_energy_joules": None, "findings": [],
        "verdicts": {"gpu_utilization": "no data", "gpu_memory": "no data", "sm_active": "no data"},
        "thresholds": Thresholds().as_dict(),
    }  # fmt: skip


def test_the_cpu_side_efficiency_energy_share_and_findings():
    """Two nodes of one job, 10 samples 30 s apart: n1's 8 CPUs saturated while the GPUs idle (input-bound), its
    memory at 97 % of the limit and swapping; n2 half busy. CPU energy: power x the job's share at each step."""
    job = report.Job("7", "alice", "ml", 0.0, 300.0, 30.0, [("n1", "0", "GPU-a"), ("n2", "0", "GPU-b")])
    rows = []
    for step in range(10):
        at = step * 30.0
        for node, used, share, power in (("n1", 7.6, 0.5, 200.0), ("n2", 4.0, 1.0, 100.0)):
            values = {
                "utilization": 0.1, "job_cpu_cores_used": used, "job_cpus_allocated": 8.0,
                "job_memory_used_bytes": (31 if node == "n1" else 8) * 2**30, "job_memory_limit_bytes": 32 * 2**30,
                "job_swap_used_bytes": 2**29 if node == "n1" else 0.0, "job_io_bytes_per_second": 2**20,
                "cpu_power_watts": power, "job_cpu_share": share,
                # perf counters: n1 retires 0.4 instructions per cycle (memory-bound), n2 2.5
                "job_instructions_per_second": 2e9 if node == "n1" else 5e9,
                "job_cycles_per_second": 5e9 if node == "n1" else 2e9,
                "job_flops": 3e9, "job_double_flops": 1e9, "job_cache_misses_per_second": 1e8,
            }  # fmt: skip
            for metric, value in values.items():
                gpu, uuid = ("0", "GPU-a" if node == "n1" else "GPU-b") if metric == "utilization" else ("", "")
                rows.append({"time": at, "node": node, "gpu": gpu, "uuid": uuid, "metric": metric, "value": value})
    frame = pd.DataFrame(rows)
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    summary = report.summarize(job, frame)
    n1, n2 = summary["node_summary"]
    assert n1["job_cpu_efficiency"] == pytest.approx(0.95) and n2["job_cpu_efficiency"] == pytest.approx(0.5)
    assert summary["cpu_efficiency"] == pytest.approx((7.6 + 4.0) / 16)
    assert n1["cpu_energy_joules"] == pytest.approx(200 * 0.5 * 300) and n2["cpu_energy_joules"] == pytest.approx(
        100 * 1.0 * 300
    )
    assert summary["total_energy_joules"] == pytest.approx(summary["energy_joules"] + 60000)
    assert n1["job_io_bytes"] == pytest.approx(2**20 * 300)
    assert summary["findings"] == [
        "n1: GPUs mostly idle (10 %) while the job's 8 CPUs were saturated (95 %): input-bound; more data-loader "
        "workers or CPUs per GPU",
        "n1: memory peaked at 97 % of the job's limit: close to being killed",
        "n1: the job's CPU code retired 0.40 instructions per cycle on busy cores: stalled on memory; look at data "
        "layout or memory-bound preprocessing",
        "n1: the job swapped (512 MiB at peak)",
    ]
    assert n1["job_instructions_per_cycle"] == pytest.approx(0.4) and n2["job_instructions_per_cycle"] == pytest.approx(
        2.5
    )
    assert n1["job_flops_mean"] == pytest.approx(3e9) and n1["job_double_flops_mean"] == pytest.approx(1e9)
    assert n1["job_cache_miss_bytes_per_second"] == pytest.approx(64e8)
    page = report.html(summary, [], "http://127.0.0.1:9090")
    assert "input-bound" in page and "CPU efficiency" in page and "instructions per cycle" in page


def test_report_keeps_every_series_under_prometheus_point_limit():
    for seconds in (60, 3600, 86400, 30 * 86400, 365 * 86400):
        assert seconds / step_for(seconds) + 1 <= MAX_POINTS
    assert step_for(60) == 1


def test_a_job_without_rapl_says_cpu_energy_not_measured_never_zero():
    """No node of the job has RAPL (no cpu_power_watts series): the CPU energy and the total are null in the summary,
    and the HTML and PDF say "not measured", never "CPU 0 J"."""
    job = report.Job("8", "bob", "", 0.0, 300.0, 30.0, [("n1", "0", "GPU-0")])
    rows = gpu_rows({("n1", "GPU-0"): [0.5] * 10}) + gpu_rows(
        {("n1", "GPU-0"): [1000.0 + 300 * i for i in range(10)]}, "energy_joules_total"
    )
    rows += [{"time": i * 30.0, "node": "n1", "gpu": "", "uuid": "", "metric": "job_cpu_share", "value": 0.5}
             for i in range(10)]  # fmt: skip
    summary = report.summarize(job, frame_of(rows))
    assert summary["cpu_energy_joules"] is None and summary["total_energy_joules"] is None
    assert summary["node_summary"][0]["cpu_energy_joules"] is None
    assert summary["energy_joules"] == pytest.approx(2700.0)
    page = report.html(summary, [], "http://127.0.0.1:9090")
    assert "CPU not measured (no RAPL on the job's nodes)" in page and "CPU 0 J" not in page
    assert energy_line(summary).endswith("CPU not measured (no RAPL on the job's nodes)")
    assert json.loads(json.dumps(without_float_noise(summary)))["cpu_energy_joules"] is None


def test_the_header_names_only_what_the_record_says():
    """A job without an account (OAR without a project, Slurm's default) is not shown "account ?"."""
    summary = _minimal_summary()
    assert owner({**summary, "user": "bob"}) == "User bob"
    assert owner({**summary, "user": "bob", "account": "physics"}) == "User bob, account physics"
    assert owner(summary) == "User not recorded"
    page = report.html({**summary, "user": "bob"}, [], "http://127.0.0.1:9090")
    assert "<p>User bob; 0 GPU(s)" in page and "?" not in page.split("<body>")[1].split("<h2>")[0]


def test_the_summary_json_has_no_float_noise():
    utilization = [0.1, 0.2, 0.7, 0.1, 0.2, 0.7]  # sums of these carry binary noise
    job = report.Job("9", "u", "a", 0.0, 150.0, 30.0, [("n1", "0", "GPU-0")])
    summary = report.summarize(job, frame_of(gpu_rows({("n1", "GPU-0"): utilization})))
    written = json.dumps(without_float_noise({**summary, "noise": 0.1 + 0.2, "nested": [{"x": 1 - 0.9}]}))
    assert '"noise": 0.3,' in written and '"x": 0.1' in written
    assert "99999999" not in written and "00000000" not in written
    assert without_float_noise({"kept": 123456.789, "count": 3, "none": None}) == {
        "kept": 123456.789, "count": 3, "none": None
    }  # fmt: skip


def test_the_report_gives_the_stragglers_reasons_beyond_its_gpu():
    """As AccelmonJobStraggler reads them (issue 59): GPU 2's NIC at fault (accelmon:gpu_path_fault) and the job's
    CPUs on its node throttled over the deployed threshold; GPU 1 straggles too, its node's CPUs under it."""
    job = report.Job("11", "u", "a", 0.0, 600.0, 30.0, [("n1", str(i), f"GPU-{i}") for i in range(4)])
    busy = {("n1", f"GPU-{i}"): [0.6] * 20 for i in range(4)}
    power = {("n1", f"GPU-{i}"): [300.0] * 20 for i in range(4)}
    power[("n1", "GPU-2")] = [200.0] * 20
    clock = {("n1", f"GPU-{i}"): [1.98e9] * 20 for i in range(4)}
    nic = {("n1", "GPU-2"): [0.0] * 5 + [1.0] * 15}
    rows = gpu_rows(busy) + gpu_rows(power, "power_watts") + gpu_rows(clock, "sm_clock_hertz")
    rows += gpu_rows(nic, "nic_fault")
    rows += [{"time": i * 30.0, "node": "n1", "gpu": "", "uuid": "", "metric": "job_cpu_throttled", "value": 0.35}
             for i in range(20)]  # fmt: skip
    (entry,) = report.summarize(job, frame_of(rows))["stragglers"]
    assert entry["reasons"] == [
        "the NIC its traffic leaves by down, trained slow or counting errors",
        "the job's CPUs on n1 held back by their quota (0.35 s a second)",
    ]
    site = Thresholds(straggler_cpu_throttled=0.5)  # the deployed rules' threshold: 0.35 is under it
    (entry,) = report.summarize(job, frame_of(rows), site)["stragglers"]
    assert entry["reasons"] == ["the NIC its traffic leaves by down, trained slow or counting errors"]


def test_a_straggler_is_what_the_live_rule_names():
    """Four busy GPUs (60 %) of a job; GPU 2's power falls to 200 W against its peers' 300 W (under 0.8 of the
    median) for 5 minutes mid-run: the report names it as AccelmonJobStraggler did while the job ran, and says what
    was measured in the rule's terms."""
    job = report.Job("10", "u", "a", 0.0, 600.0, 30.0, [("n1", str(i), f"GPU-{i}") for i in range(4)])
    busy = {("n1", f"GPU-{i}"): [0.6] * 20 for i in range(4)}
    power = {("n1", f"GPU-{i}"): [300.0 - i] * 20 for i in range(4)}
    power[("n1", "GPU-2")] = [300.0] * 5 + [200.0] * 10 + [300.0] * 5  # ten 30 s samples under: 5 minutes
    clock = {("n1", f"GPU-{i}"): [1.98e9 - 1e7 * i] * 20 for i in range(4)}  # a few percent apart: healthy
    rows = gpu_rows(busy) + gpu_rows(power, "power_watts") + gpu_rows(clock, "sm_clock_hertz")
    summary = report.summarize(job, frame_of(rows))
    (entry,) = summary["stragglers"]
    assert (entry["node"], entry["gpu"], entry["longest_seconds"]) == ("n1", "2", 300.0)
    assert entry["below_median_ratio"] == {"sm_clock_hertz": 0.9, "power_watts": 0.8}
    assert entry["below_median_share"] == {"sm_clock_hertz": 0.0, "power_watts": 0.5}
    assert entry["reasons"] == ["slower than its peers, cause unknown"]
    page = report.html(summary, [], "http://127.0.0.1:9090")
    assert "power under 80.0 % of the job&#39;s median 50.0 % of its busy time; 5 min at a stretch" in page
    # One sample less is under the rule's 5 minutes: the live rule would not have fired, nor does the report.
    power[("n1", "GPU-2")] = [300.0] * 5 + [200.0] * 9 + [300.0] * 6
    rows = gpu_rows(busy) + gpu_rows(power, "power_watts") + gpu_rows(clock, "sm_clock_hertz")
    assert report.summarize(job, frame_of(rows))["stragglers"] == []
    # A site whose rule waits 2 minutes (and calls power under 0.7 of the median a straggler) had the alert fire:
    # judged at the deployed rules' thresholds, the report names the GPU too, in those terms.
    site = Thresholds(straggler_for_seconds=120.0, straggler_power_ratio=0.7)
    (entry,) = report.summarize(job, frame_of(rows), site)["stragglers"]
    assert entry["gpu"] == "2" and entry["below_median_ratio"]["power_watts"] == 0.7
    # Nor while the job is not busy (median utilization under 0.3), nor on a GPU that does not work (under 0.05).
    for utilization in ({k: [0.2] * 20 for k in busy}, {**busy, ("n1", "GPU-2"): [0.01] * 20}):
        power[("n1", "GPU-2")] = [200.0] * 20
        rows = gpu_rows(utilization) + gpu_rows(power, "power_watts") + gpu_rows(clock, "sm_clock_hertz")
        assert report.summarize(job, frame_of(rows))["stragglers"] == []
    # A job of one GPU has no peers to lag.
    alone = report.Job("11", "u", "a", 0.0, 600.0, 30.0, [("n1", "0", "GPU-0")])
    rows = gpu_rows({("n1", "GPU-0"): [0.6] * 20}) + gpu_rows({("n1", "GPU-0"): [100.0] * 20}, "power_watts")
    assert report.summarize(alone, frame_of(rows))["stragglers"] == []


def test_the_live_alerts_of_the_job_are_in_the_report():
    summary = {
        **_minimal_summary(),
        "live_alerts": [
            {"alert": "AccelmonJobStraggler", "reason": "thermal", "node": "n1", "gpu": "2",
             "first_firing": 3600.0, "last_firing": 4200.0},
            {"alert": "AccelmonJobHung", "reason": "utilization_power", "node": "", "gpu": "",
             "first_firing": 7200.0, "last_firing": 7260.0},
        ],
    }  # fmt: skip
    page = report.html(summary, [], "http://127.0.0.1:9090")
    assert "AccelmonJobStraggler (thermal) on n1 GPU 2, 01:00-01:10 UTC" in page
    assert "AccelmonJobHung (utilization_power), 02:00-02:01 UTC" in page
    assert "None fired" in report.html(_minimal_summary(), [], "http://127.0.0.1:9090")
