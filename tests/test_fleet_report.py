"""accelmon-report --fleet over a real Prometheus holding a simulated week of the ledger's recorded counts (backfilled
with promtool, as an operator backfills): the GPU-hours per state, account, user, node and day, the sentences, the
tables, and the HTML and PDF opened as a person would."""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from accelmon.report import fleet  # noqa: E402  (its plots need matplotlib: after the skip)

GPUS = 100
# The fleet's GPUs in each state, constant over the week; the job states by (account, user); the lost by node.
FLEET = {"productive": 60, "straggling": 3, "idle": 10, "hung": 2, "free": 20, "drained": 3, "unhealthy": 2}
ACCOUNTS = {
    ("vision", "ann", "idle"): 4,
    ("nlp", "bob", "idle"): 6,
    ("nlp", "bob", "hung"): 2,
    ("vision", "ann", "straggling"): 3,
    ("vision", "ann", "productive"): 40,
    ("nlp", "bob", "productive"): 20,
}
NODES = {("n7", "drained"): 3, ("n3", "unhealthy"): 2}
DAYS = 7
STEP = 60
GAP_HOURS = 6  # on the fourth day the master was down: no state recorded for 6 hours


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """A Prometheus whose storage holds the week just ended (1-minute samples), started on it; its URL, the range."""
    assert sum(FLEET.values()) == GPUS
    work = tmp_path_factory.mktemp("fleet")
    end = (int(time.time()) // 3600 - 1) * 3600  # an hour boundary well inside the head's past
    start = end - DAYS * 86400
    gap = range(start + 3 * 86400, start + 3 * 86400 + GAP_HOURS * 3600)
    lines = []
    for name, series in (
        ("cluster:accelmon_gpus_by_state:count", {f'state="{s}"': v for s, v in FLEET.items()}),
        ("account:accelmon_gpus_by_state:count",
         {f'account="{a}",user="{u}",state="{s}"': v for (a, u, s), v in ACCOUNTS.items()}),
        ("node:accelmon_gpus_by_state:count", {f'node="{n}",state="{s}"': v for (n, s), v in NODES.items()}),
    ):  # fmt: skip
        lines.append(f"# TYPE {name.replace(':', '_')} gauge")
        for labels, value in series.items():
            # Each minute's counts recorded 15 s before the report's step falls (rules run on their own clock).
            lines += [f"{name}{{{labels}}} {value} {t - 15}" for t in range(start, end + 1, STEP) if t not in gap]
    lines.append("# EOF")
    data = work / "week.om"
    data.write_text("\n".join(lines) + "\n")
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and prometheus, "scripts/setup.sh unpacks Prometheus's binaries into .tools/"
    tsdb = work / "tsdb"
    made = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text("global: {}\n")
    process = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tsdb}", "--storage.tsdb.retention.time=90d",
         f"--web.listen-address=127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def loaded() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?query=count(cluster:accelmon_gpus_by_state:count)"
                                        f"&time={end}", timeout=5) as answer:  # fmt: skip
                return bool(json.load(answer)["data"]["result"])
        except OSError:
            return False

    try:
        wait_until(loaded, 60, "Prometheus serving the backfilled week", every=0.5)
        yield url, start, end
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def report(week, tmp_path_factory):
    url, start, end = week
    out = tmp_path_factory.mktemp("fleet-report")
    result = subprocess.run(
        [sys.executable, "-m", "accelmon.report", "--fleet", "--from", str(start), "--to", str(end),
         "--prometheus", url, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out, json.loads((out / "summary.json").read_text()), result.stdout


def test_gpu_hours_per_state_add_up_to_the_fleet(report):
    _, summary, said = report
    hours = DAYS * 24 + 1 / 60 - GAP_HOURS  # both ends of the range are samples: one minute more than the week
    assert summary["gpu_hours"] == pytest.approx(GPUS * hours, rel=1e-6)
    for state, gpus in FLEET.items():
        assert summary["gpu_hours_by_state"][state] == pytest.approx(gpus * hours, rel=1e-6)
    assert summary["goodput"] == pytest.approx(0.60) and summary["allocation"] == pytest.approx(0.75)
    assert "goodput 60.0 %" in said


def test_the_sentences_say_each_number(report):
    _, summary, _ = report
    text = " ".join(summary["sentences"])
    assert "Of 16,202 GPU-hours, 9,721 GPU-hours (60.0 %) did useful work" in text
    # 12 of 100 GPUs idle or hung, nlp's 8 of them.
    assert (
        "1,944 GPU-hours of 16,202 GPU-hours (12.0 %) were held by jobs that used them under the idle threshold or "
        "hung; "
        "account nlp 66.7 % of it" in text
    )
    assert (
        "(5.0 %) were lost to failing GPUs (324 GPU-hours), to nodes out of service (486 GPU-hours) and to nodes that "
        "did not answer (0 GPU-hours); most on n7 (486 GPU-hours)" in text
    )


def test_the_report_checks_itself_and_names_the_gap(report, week):
    """The GPU-hours the fleet had (100 GPUs over the week and a minute) against those the ledger holds, in the first
    sentences; the 6 hours without a recorded state named, to the minute."""
    _, summary, _ = report
    _, start, _ = week
    assert summary["fleet_gpu_hours"] == pytest.approx(GPUS * (DAYS * 24 + 1 / 60), rel=1e-6)
    assert summary["accounted_gpu_hours"] == pytest.approx(GPUS * (DAYS * 24 + 1 / 60 - GAP_HOURS), rel=1e-6)
    (gap,) = summary["gaps"]
    began = datetime.datetime.fromtimestamp(start + 3 * 86400 - STEP, datetime.timezone.utc)
    assert (gap["from"], gap["gpu_hours"]) == (began.isoformat(), pytest.approx(GPUS * GAP_HOURS))
    assert summary["sentences"][0] == (
        "The fleet had 16,802 GPU-hours over the range; the ledger accounts for 16,202 GPU-hours of them (96.4 %)."
    )
    ended = began + datetime.timedelta(hours=GAP_HOURS)
    assert summary["sentences"][1] == (
        f"No state was recorded from {began:%Y-%m-%d %H:%M} UTC to {ended:%Y-%m-%d %H:%M} UTC: 600 GPU-hours the "
        "ledger cannot place (the master or its rules were not running, or a shard was down)."
    )


def test_tables_by_day_account_user_and_node(report):
    out, summary, _ = report
    for table in (pd.read_csv(out / "ledger.csv", keep_default_na=False), pd.read_parquet(out / "ledger.parquet")):
        assert list(table.columns) == ["day", "scope", "account", "user", "node", "state", "gpu_hours"]
        assert set(table.scope) == {"fleet", "account", "node"}
        assert table[table.scope == "fleet"].day.nunique() == DAYS + 1  # the range starts and ends mid-day (UTC)
        accounts = table[table.scope == "account"].groupby("account").gpu_hours.sum()
        assert accounts["vision"] / accounts["nlp"] == pytest.approx(47 / 28)
    assert [a["account"] for a in summary["top_accounts_idle_or_hung"]] == ["nlp", "vision"]
    assert [n["node"] for n in summary["top_nodes_lost"]] == ["n7", "n3"]


def test_the_html_and_the_pdf_open(report, tmp_path):
    out, _, _ = report
    page = (out / "report.html").read_text()
    assert "<h1>Fleet ledger</h1>" in page and "http" not in page.split("<body>")[1].split("accelmon-report --fleet")[0]
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert {title for title, _ in images} == {"GPU-hours by state, per day", "Top accounts by idle and hung GPU-hours"}
    assert shutil.which("pdftotext") and shutil.which("pdftoppm"), "scripts/setup.sh installs poppler-utils"


def test_a_range_without_data_says_so(week, tmp_path):
    url, start, _ = week
    result = subprocess.run(
        [sys.executable, "-m", "accelmon.report", "--fleet", "--from", str(start - 30 * 86400), "--to",
         str(start - 20 * 86400), "--prometheus", url, "--out", str(tmp_path / "empty")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "empty" / "summary.json").read_text())
    assert summary["gpu_hours"] == 0 and "holds no GPU in this range" in summary["sentences"][0]


def test_bad_ranges_are_refused_before_anything_is_written(tmp_path):
    for args, message in (
        (["--from", "last tuesday"], "expected a date"),
        (["--from", "2026-11-27", "--to", "2026-11-20"], "--to must be after --from"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "accelmon.report", "--fleet", *args, "--prometheus", "http://127.0.0.1:9",
             "--out", str(tmp_path / "never")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2 and message in result.stderr
        assert not (tmp_path / "never").exists()


def test_the_fleet_report_is_documented():
    assert "accelmon-report --fleet" in (Path(__file__).parents[1] / "docs" / "ledger.md").read_text()


@pytest.mark.parametrize(
    ("hours", "said"),
    [(16202.4, "16,202 GPU-hours"), (10, "10 GPU-hours"), (2.5, "150 GPU-minutes"), (0.05, "3.0 GPU-minutes"),
     (0.001, "4 GPU-seconds"), (0, "0 GPU-hours")],
)  # fmt: skip
def test_gpu_time_reads_right_at_any_size(hours, said):
    """A short range read "0 GPU-hours (25 %)": no time that is not zero reads as 0."""
    assert fleet.amount(hours) == said


def test_a_short_range_says_minutes_and_its_times_to_the_minute():
    """An hour of 4 GPUs: the shares in GPU-minutes, the range to the minute with its zone (it printed microseconds)."""
    shares = (("productive", 3.0), ("idle", 0.25), ("free", 0.75))
    table = [{"day": "2026-11-27", "scope": "fleet", "account": "", "user": "", "node": "", "state": state,
              "gpu_hours": hours} for state, hours in shares]  # fmt: skip
    start = 1795740000.123456
    summary = fleet.summarize(table, start, start + 3600, 60, {"fleet_gpu_hours": 4.0, "gaps": []})
    text = " ".join(summary["sentences"])
    assert "Of 240 GPU-minutes, 180 GPU-minutes (75.0 %) did useful work" in text
    assert "15 GPU-minutes of 240 GPU-minutes (6.2 %)" in text and " 0 GPU-hours (" not in text
    page = fleet.html(summary, [], "http://prometheus:9090")
    assert "2026-11-27 00:40 UTC to 2026-11-27 01:40 UTC" in page


def read_pdf(path: Path, tmp_path: Path) -> tuple[str, str, int]:
    """(its text, its page size as pdfinfo says it, how many pages rendered to images with ink on them)."""
    import matplotlib.image as mpimg

    text = subprocess.run(["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True).stdout
    info = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True, check=True).stdout
    size = re.search(r"Page size:\s+(.+)", info).group(1)  # type: ignore[union-attr]
    folder = tmp_path / path.stem
    folder.mkdir()
    subprocess.run(["pdftoppm", "-r", "30", "-png", str(path), str(folder / "page")], check=True)
    inked = [page for page in sorted(folder.glob("page*.png")) if mpimg.imread(page).std() > 0.01]
    return " ".join(text.split()), size, len(inked)


def test_the_pdf_is_the_same_report_as_the_page_over_a_week(report, tmp_path):
    """The PDF's first page was the text in a monospace dump: now the title, the sentences, the tables and the charts,
    on numbered A4 pages, every page inked."""
    out, summary, _ = report
    text, size, inked = read_pdf(out / "report.pdf", tmp_path)
    assert "(A4)" in size
    pages = int(re.search(r"page 1 of (\d+)", text).group(1))  # type: ignore[union-attr]
    assert pages >= 2 and inked == pages and f"page {pages} of {pages}" in text
    assert text.startswith("Fleet ledger") and "GPU-hours by state" in text
    assert " ".join(summary["sentences"][0].split()) in text
    for title in ("GPU-hours by state, per day", "Top users by idle and hung GPU-hours", "GPU-hours lost by node"):
        assert title in text
    assert f"productive {summary['gpu_hours_by_state']['productive']:,.1f} 60.0 %" in text  # the page's table row


def test_a_short_range_reads_right_in_both_forms_on_letter_paper(tmp_path):
    """An hour of 4 GPUs on Letter paper: minutes, not "0 GPU-hours"; the range to the minute; numbered pages, each
    inked; the HTML the same sentences, opened by a browser."""
    from tests.test_report import chromium

    shares = (("productive", 3.0), ("idle", 0.25), ("free", 0.75))
    table = [{"day": "2026-11-27", "scope": "fleet", "account": "", "user": "", "node": "", "state": state,
              "gpu_hours": hours} for state, hours in shares]  # fmt: skip
    summary = fleet.summarize(table, 1795740000, 1795743600, 60, {"fleet_gpu_hours": 4.0, "gaps": []})
    pages = fleet.pdf(summary, fleet.plots(summary), tmp_path / "short.pdf", "letter")
    text, size, inked = read_pdf(tmp_path / "short.pdf", tmp_path)
    assert "(letter)" in size and inked == pages and f"page {pages} of {pages}" in text
    assert "2026-11-27 00:40 UTC to 2026-11-27 01:40 UTC" in text and "180 GPU-minutes (75.0 %)" in text
    (tmp_path / "short.html").write_text(fleet.html(summary, fleet.plots(summary), "http://prometheus:9090"))
    dom = chromium("--dump-dom", (tmp_path / "short.html").as_uri())
    assert dom.returncode == 0 and "180 GPU-minutes (75.0 %)" in dom.stdout, dom.stderr[-1000:]
