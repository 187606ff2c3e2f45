"""accelmon-report's command line: find the job, query, judge, render, write."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, TypeVar

from accelmon.report.analysis import summarize
from accelmon.report.query import (
    JOB_ID,
    Prometheus,
    ReportError,
    collect,
    duration_seconds,
    find_job,
    hardware,
    live_alerts,
)
from accelmon.report.render import html, pdf, plots
from accelmon.report.thresholds import deployed


def without_float_noise(value: Any) -> Any:
    """Floats to 12 significant digits, everywhere in the summary: 0.09999999999999996 is written 0.1 (sums and
    differences of samples carry binary noise no measurement has)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {key: without_float_noise(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_float_noise(item) for item in value]
    return value


def write_report(prometheus: Prometheus, job_id: str, out: Path, lookback: float, now: float | None = None) -> dict:
    job = find_job(prometheus, job_id, lookback, time.time() if now is None else now)
    frame = collect(prometheus, job)
    thresholds, source = deployed(prometheus)
    summary = summarize(job, frame, thresholds)
    summary["thresholds_source"] = source
    summary["hosts"] = hardware(prometheus, job)
    summary["live_alerts"] = live_alerts(prometheus, job)
    images = plots(job, frame)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "data.csv", index=False)
    frame.to_parquet(out / "data.parquet", index=False)
    (out / "summary.json").write_text(json.dumps(without_float_noise(summary), indent=2) + "\n")
    (out / "report.html").write_text(html(summary, images, prometheus.url), encoding="utf-8")
    pdf(summary, images, out / "report.pdf")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accelmon-report",
        description="A batch job's report (HTML, PDF, CSV, Parquet, JSON) from the Prometheus of an accelmon cluster.",
    )
    parser.add_argument("job_id", nargs="?", help="the scheduler's job id (a job's report)")
    parser.add_argument(
        "--fleet", action="store_true", help="the fleet's ledger over --from/--to instead of a job (docs/ledger.md)"
    )
    parser.add_argument("--from", dest="start", metavar="WHEN", help="with --fleet: a date, ISO time or epoch")
    parser.add_argument(
        "--to", dest="end", metavar="WHEN", help="with --fleet: a date, ISO time or epoch (default now)"
    )
    parser.add_argument(
        "--paper", choices=("a4", "letter"), default="a4", help="with --fleet: the PDF's page size (default a4)"
    )
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus's URL, e.g. http://master:9090")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default ./accelmon-report-JOB_ID)")
    parser.add_argument("--lookback", default="30d", help="how far back to look for the job (default 30d)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each query (default 30)")
    args = parser.parse_args(argv)
    if args.fleet:
        return fleet_main(args)
    if not args.job_id:
        parser.error("a job id, or --fleet")
    out = Path(args.out or f"accelmon-report-{args.job_id}")

    def job_report() -> dict:
        if not JOB_ID.match(args.job_id):
            raise ReportError(f"job id {args.job_id!r}: expected letters, digits and _.-[] only", 2)
        check_extra()
        return write_report(
            Prometheus(args.prometheus, args.timeout), args.job_id, out, duration_seconds(args.lookback)
        )

    summary, status = reported(job_report)
    if summary is None:
        return status
    print(
        f"accelmon-report: job {args.job_id}: {len(summary['gpus'])} GPU(s) on {len(summary['nodes'])} node(s), "
        f"{summary['duration_seconds'] / 60:.1f} min, {summary['energy_kwh']:.4f} kWh, "
        f"{len(summary['stragglers'])} straggler(s); written to {out}/"
    )
    return 0


Made = TypeVar("Made")


def reported(make: Callable[[], Made]) -> tuple[Made | None, int]:
    """What `make()` returns and 0, or None and the exit status, its error said on stderr."""
    try:
        return make(), 0
    except ReportError as error:
        print(f"accelmon-report: {error}", file=sys.stderr)
        return None, error.status
    except OSError as error:
        print(f"accelmon-report: cannot write the report: {error}", file=sys.stderr)
        return None, 1


def check_extra() -> None:
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as error:
        raise ReportError(f"missing {error.name}: pip install 'accelmon[report]'", 2) from error


def fleet_main(args: argparse.Namespace) -> int:
    """accelmon-report --fleet: the ledger over a range (a week ending now unless --from and --to say)."""
    from accelmon.report.fleet import parse_time, write_fleet_report

    def fleet_report() -> tuple[dict, Path]:
        if args.job_id:
            raise ReportError("--fleet takes no job id", 2)
        check_extra()
        end = parse_time(args.end) if args.end else time.time()
        start = parse_time(args.start) if args.start else end - 7 * 86400
        out = Path(args.out or f"accelmon-fleet-{time.strftime('%Y%m%d', time.gmtime(start))}")
        return write_fleet_report(Prometheus(args.prometheus, args.timeout), start, end, out, args.paper), out

    written, status = reported(fleet_report)
    if written is None:
        return status
    summary, out = written
    goodput = summary["goodput"]
    print(
        f"accelmon-report: fleet {summary['from'][:10]} to {summary['to'][:10]}: {summary['gpu_hours']:,.0f} GPU-hours,"
        f" goodput {'n/a' if goodput is None else f'{100 * goodput:.1f} %'}; written to {out}/"
    )
    return 0
