"""accelmon-report against a real Prometheus scraping the exporter (the master contract's fleet: 8 fake GPUs whose
energy counters grow by their power, Slurm jobs 100 and 200 sharing a GPU) and against broken inputs."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.support.cloudwatch_doubles import LoopbackServer, QuietHandler, SilentSocket
from tests.support.jobs_tree import uuid
from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("pyarrow")

# Job 100 holds Slurm's GPUs 0 and 1: device minors 0 and 1, which are NVML's GPUs 1 and 3 on this fixture. The fake
# driver draws 100 + 10.5 x index W and is 10 + 10 x index % busy.
POWER = {"1": 110.5, "3": 131.5}


def report(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmon.report", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def job_100(prometheus, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "job-100"
    time.sleep(15)  # the fleet has just started: let the job run a while
    result = report("100", "--prometheus", prometheus, "--out", str(out), "--lookback", "1h")
    assert result.returncode == 0, result.stderr
    return out, json.loads((out / "summary.json").read_text()), result


def test_report_finds_the_jobs_nodes_gpus_window_and_energy(job_100):
    _, summary, result = job_100
    assert "job 100: 2 GPU(s) on 1 node(s)" in result.stdout
    assert summary["nodes"] == ["gpu-node-1"] and (summary["user"], summary["account"]) == ("alice", "ml")
    assert {(g["gpu"], g["uuid"]) for g in summary["gpus"]} == {("1", uuid(1)), ("3", uuid(3))}
    assert 15 < summary["duration_seconds"] < 300
    # The energy counters grow by the power draw: the job's energy is their sum over its window (reads every 1 s).
    expected = sum(POWER.values()) * summary["duration_seconds"]
    assert abs(summary["energy_joules"] - expected) <= sum(POWER.values()) * 3, (summary["energy_joules"], expected)
    assert summary["energy_kwh"] == pytest.approx(summary["energy_joules"] / 3.6e6)
    busy = {g["gpu"]: g["utilization_mean"] for g in summary["gpus"]}
    assert busy == {"1": pytest.approx(0.2), "3": pytest.approx(0.4)}
    assert summary["gpu_utilization_mean"] == pytest.approx(0.3) and summary["verdicts"]["gpu_utilization"] == "low"
    assert summary["gpu_hours_idle"] == 0 and summary["gpu_hours_allocated"] == pytest.approx(
        2 * summary["duration_seconds"] / 3600
    )


def test_a_short_recent_job_is_found_with_the_default_30_day_lookback(prometheus, tmp_path):
    """Over 30 days the first pass steps 238 s; a job younger than one step, or between two points, was missed
    (points counted from the window's start stopped up to a step short of now; plain selectors saw only instants)."""
    result = report("100", "--prometheus", prometheus, "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert "job 100: 2 GPU(s) on 1 node(s)" in result.stdout


def test_each_nodes_hardware_is_in_the_summary_and_the_html(job_100):
    out, summary, _ = job_100
    (host,) = summary["hosts"]
    # The simulated node's node_exporter reads this machine's /proc; its exporter the fake NVML's H100s.
    assert host["node"] == "gpu-node-1" and host["cpus"] == os.cpu_count()
    assert host["counters_unavailable"] == ["all (collector job_perf off)"]  # the simulated node counts no perf events
    assert host["memory_bytes"] == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), rel=0.05)
    models = {line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")}
    assert host["cpu_model"] == ", ".join(sorted(models)) and host["sockets"] >= 1
    assert "x NVIDIA H100 80GB HBM3" in host["gpus"] and host["gpu_driver"]
    assert host["kernel"].startswith(os.uname().release)
    assert "<h2>Hosts</h2>" in (out / "report.html").read_text()


def test_the_report_judges_at_the_thresholds_of_the_deployed_rules(job_100):
    """The thresholds come from the rules this Prometheus evaluates (its rules API), every one of them found in
    the expressions as Prometheus prints them back; here they are the master role's defaults."""
    from accelmon.report.thresholds import Thresholds

    out, summary, _ = job_100
    assert summary["thresholds_source"] == "the deployed rules"
    assert summary["thresholds"] == Thresholds().as_dict()
    assert "Judged at the thresholds of the deployed rules" in (out / "report.html").read_text()


def test_a_healthy_job_has_no_straggler_and_no_live_alert(job_100):
    """GPUs 1 and 3 draw 110.5 and 131.5 W at SM clocks 1740 and 1710 MHz: a few percent from the job's median,
    which AccelmonJobStraggler never judges a straggler, nor does the report. The fleet's Prometheus evaluates the
    live rules: none fired on the job."""
    out, summary, _ = job_100
    assert summary["stragglers"] == [] and summary["live_alerts"] == []
    assert "None: every GPU kept up" in (out / "report.html").read_text()


def test_tidy_data_in_csv_and_parquet(job_100):
    out, _, _ = job_100
    text = {"node": str, "gpu": str, "uuid": str, "metric": str}  # GPU indices are names, not numbers
    for table in (
        pd.read_csv(out / "data.csv", dtype=text, keep_default_na=False),
        pd.read_parquet(out / "data.parquet"),
    ):
        assert list(table.columns) == ["time", "node", "gpu", "uuid", "metric", "value"]
        metrics = set(table.metric)
        assert {"utilization", "power_watts", "energy_joules_total", "cpu_utilization"} <= metrics
        gpus = table[table.metric == "utilization"]
        assert set(gpus.gpu.astype(str)) == {"1", "3"} and len(gpus) >= 2 * 5
    assert len(pd.read_csv(out / "data.csv")) == len(pd.read_parquet(out / "data.parquet"))


def test_html_opens_offline_and_every_plot_has_data(job_100):
    import matplotlib.image as mpimg

    out, _, _ = job_100
    page = (out / "report.html").read_text()
    assert (
        "<h1>Job 100</h1>" in page
        and "gpu-node-1" in page
        and "http" not in page.split("<body>")[1].split("accelmon-report; data:")[0]
    ), "the page loads nothing from the network"
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    titles = {title for title, _ in images}
    assert {"GPU utilization", "GPU power", "GPU memory used", "Host CPU utilization"} <= titles
    for title, data in images:
        pixels = mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.std() > 0.01, f"plot {title} is blank"


def test_pdf_pages_are_not_blank(job_100, tmp_path):
    out, _, _ = job_100
    document = (out / "report.pdf").read_bytes()
    assert document.startswith(b"%PDF")
    if shutil.which("pdftoppm") is None:
        pytest.fail("pdftoppm not found: scripts/setup.sh installs poppler-utils")
    subprocess.run(["pdftoppm", "-r", "30", "-png", str(out / "report.pdf"), str(tmp_path / "page")], check=True)
    import matplotlib.image as mpimg

    pages = sorted(tmp_path.glob("page*.png"))
    assert len(pages) >= 3  # the summary, then the plots two to a page
    for page in pages:
        assert mpimg.imread(page).std() > 0.01, f"{page.name} is blank"
    first = subprocess.run(["pdftotext", "-l", "1", str(out / "report.pdf"), "-"], capture_output=True, text=True)
    assert "CPU counters not counted: all (collector job_perf off)" in first.stdout.replace("\n", " ")


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium not found: scripts/setup.sh installs Debian's chromium")
    # Root (our CI) needs --no-sandbox; nothing here is fetched from the network (the page is offline by design).
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_the_html_renders_in_a_browser_with_every_plot_drawn(job_100, tmp_path):
    """Headless Chromium opens report.html: every plot decodes to an image with pixels, and a full-page screenshot
    (kept in .cache/test-artifacts/) is not blank."""
    out, _, _ = job_100
    # A copy of the page that writes, once loaded, each image's decoded size into the DOM Chromium prints.
    probe = tmp_path / "probe.html"
    probe.write_text(
        (out / "report.html")
        .read_text()
        .replace(
            "</body>",
            "<script>window.addEventListener('load', () => document.body.setAttribute('data-images',"
            " Array.from(document.images).map(i => i.naturalWidth + 'x' + i.naturalHeight).join(',')));"
            "</script></body>",
        )
    )
    dom = chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    sizes = re.search(r'data-images="([^"]*)"', dom.stdout)
    assert sizes, "the page did not finish loading"
    decoded = sizes.group(1).split(",")
    assert len(decoded) == len(re.findall(r"<img ", (out / "report.html").read_text())) >= 6
    assert all(int(size.split("x")[0]) > 100 and int(size.split("x")[1]) > 100 for size in decoded), decoded
    artifacts = ROOT / ".cache" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    screenshot = artifacts / "report-screenshot.png"
    shot = chromium("--window-size=1280,5000", f"--screenshot={screenshot}", (out / "report.html").as_uri())
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    import matplotlib.image as mpimg

    pixels = mpimg.imread(screenshot)
    assert pixels.std() > 0.05, "the screenshot is blank"


# --- Bad input: a clear message and a non-zero exit, never a traceback ----------------------------------------------


def test_an_unknown_job(prometheus, tmp_path):
    result = report("999999", "--prometheus", prometheus, "--out", str(tmp_path / "r"), "--lookback", "1h")
    assert (
        result.returncode == 3
        and "no GPU was attributed to it" in result.stderr
        and "job that held no GPU" in (result.stderr)
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "r").exists()


def test_a_prometheus_that_does_not_answer(tmp_path):
    silent = SilentSocket()
    try:
        for url in (silent.url, "http://127.0.0.1:9"):  # accepts and never answers; refuses
            result = report("100", "--prometheus", url, "--timeout", "2", "--out", str(tmp_path / "r"))
            assert result.returncode == 1 and "does not answer" in result.stderr, result.stderr
            assert "Traceback" not in result.stderr
    finally:
        silent.close()


def test_bad_arguments(tmp_path):
    for args, message in (
        (['100"}', "--prometheus", "http://127.0.0.1:9"], "job id"),
        (["100", "--prometheus", "master:9090"], "expected an http:// or https:// URL"),
        (["100", "--prometheus", "http://127.0.0.1:9", "--lookback", "a week"], "--lookback"),
    ):
        result = report(*args)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_job_that_started_before_the_window_or_the_retention(prometheus, tmp_path):
    # Job 100 has run since the fleet started (tens of seconds): a 10 s lookback cannot see its start.
    result = report("100", "--prometheus", prometheus, "--lookback", "10s", "--out", str(tmp_path / "r"))
    assert result.returncode == 3 and "widen --lookback" in result.stderr

    # A Prometheus keeping 30 minutes, with the job's series from an hour ago (a stand-in answering its API).
    now = time.time()

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith("/api/v1/status/runtimeinfo"):
                data = {"storageRetention": "30m"}
            else:
                stamps = range(int(now - 3600), int(now), 60)
                labels = {"node": "n1", "gpu": "0", "uuid": "GPU-1", "user": "u", "account": "a"}
                data = {"resultType": "matrix", "result": [{"metric": labels, "values": [[t, "1"] for t in stamps]}]}
            self.answer(200, json.dumps({"status": "success", "data": data}).encode())

    server = LoopbackServer(Handler)
    try:
        result = report("5", "--prometheus", server.url, "--lookback", "2h", "--out", str(tmp_path / "r"))
    finally:
        server.close()
    assert result.returncode == 3 and "before the oldest data Prometheus keeps (retention" in result.stderr
    assert "Traceback" not in result.stderr
