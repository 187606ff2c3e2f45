"""The report's pages: plots (matplotlib), the HTML page (the template `report.html.j2`, jinja2, autoescaped: user
and account names come from job records) and the PDF, all from the summary and the tidy table."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path
from typing import Any

from accelmon.report.query import GPU_METRICS, NODE_METRICS, Job

TEMPLATE = Path(__file__).with_name("report.html.j2")


def pct(value: float | None) -> str:
    """A ratio as a percentage, for people; "n/a" where nothing was measured (the HTML and the PDF alike)."""
    return "n/a" if value is None else f"{100 * value:.1f} %"


def num(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:,.1f}{unit}"


def owner(summary: dict[str, Any]) -> str:
    """Who ran the job, as the record says it: the account left out where the record has none (never "?")."""
    user = f"User {summary['user']}" if summary["user"] else "User not recorded"
    return f"{user}, account {summary['account']}" if summary["account"] else user


def energy_line(summary: dict[str, Any]) -> str:
    """The GPUs' energy and, where every node measured it (RAPL), the job's share of the CPUs'."""
    gpus = f"{summary['energy_joules']:.0f} J = {summary['energy_kwh']:.4f} kWh (GPUs)"
    if summary["cpu_energy_joules"] is None:
        return gpus + "; CPU not measured (no RAPL on the job's nodes)"
    cpu = summary["cpu_energy_joules"]
    return gpus + f"; {summary['total_energy_joules']:.0f} J with the job's CPU share ({cpu:.0f} J)"


def straggler_line(entry: dict[str, Any]) -> str:
    """What was measured, in the live rule's terms (AccelmonJobStraggler): each signal under its share of the job's
    median, for what share of the job's busy time, and the longest unbroken stretch."""
    names = {"sm_clock_hertz": "SM clock", "power_watts": "power"}
    measured = ", ".join(
        f"{names.get(name, name)} under {pct(entry['below_median_ratio'][name])} of the job's median {pct(share)}"
        f" of its busy time"
        for name, share in entry["below_median_share"].items()
    )
    return f"{measured}; {entry['longest_seconds'] / 60:.0f} min at a stretch"


def live_line(alert: dict[str, Any]) -> str:
    """One live alert that fired on the job: what, where, why, and when (UTC)."""
    where = " ".join(part for part in (alert["node"], f"GPU {alert['gpu']}" if alert["gpu"] else "") if part)
    when = f"{time.strftime('%H:%M', time.gmtime(alert['first_firing']))}-"
    when += time.strftime("%H:%M UTC", time.gmtime(alert["last_firing"]))
    return (
        f"{alert['alert']}"
        + (f" ({alert['reason']})" if alert["reason"] else "")
        + (f" on {where}" if where else "")
        + f", {when}"
    )


PLOTTED = ("utilization", "memory_used_bytes", "power_watts", "temperature_celsius", "sm_active", "sm_clock_hertz")
NODE_PLOTTED = ("cpu_utilization", "job_cpu_cores_used", "host_memory_used_bytes", "job_memory_used_bytes",
                "job_io_bytes_per_second", "infiniband_receive_bytes_per_second",
                "infiniband_transmit_bytes_per_second", "neuroncore_utilization")  # fmt: skip


def plots(job: Job, frame: Any) -> list[tuple[str, bytes]]:
    """(title, PNG) of each plotted metric: one line per GPU (or node), over the job's window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {name: (title, unit) for name, _, unit, title in GPU_METRICS}
    titles.update({name: (title, unit) for name, _, unit, title in NODE_METRICS})
    out = []
    for name in (*PLOTTED, *NODE_PLOTTED):
        values = frame[frame.metric == name]
        if values.empty:
            continue
        title, unit = titles[name]
        figure, axes = plt.subplots(figsize=(10, 3.2), dpi=100)
        by = ["node", "gpu"] if name in PLOTTED else ["node"]
        # Bytes in GiB, rates in MiB/s: axes people read without counting digits.
        scale, unit = {"bytes": (2**30, "GiB"), "B/s": (2**20, "MiB/s")}.get(unit, (1, unit))
        for key, group in values.groupby(by):
            label = f"{key[0]} GPU {key[1]}" if name in PLOTTED else str(key[0] if isinstance(key, tuple) else key)
            axes.plot(group.time, group.value / scale, label=label, linewidth=1.2)
        axes.set_title(title)
        axes.set_ylabel(unit)
        axes.grid(alpha=0.3)
        # Beside the plot, never over the lines.
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        figure.autofmt_xdate()
        figure.tight_layout()
        image = io.BytesIO()
        figure.savefig(image, format="png")
        plt.close(figure)
        out.append((title, image.getvalue()))
    return out


def html(summary: dict[str, Any], images: list[tuple[str, bytes]], prometheus: str) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True)  # user and account names come from job records
    template = environment.from_string(TEMPLATE.read_text(encoding="utf-8"))
    encoded = [(title, base64.b64encode(png).decode()) for title, png in images]
    return template.render(
        s=summary,
        images=encoded,
        prometheus=prometheus,
        pct=pct,
        num=num,
        owner=owner,
        energy=energy_line,
        straggler=straggler_line,
        live=live_line,
    )


def pdf(summary: dict[str, Any], images: list[tuple[str, bytes]], path: Path) -> None:
    """The summary on a first page, then the plots, two to a page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    lines = [
        f"Job {summary['job_id']}   {owner(summary)}",
        f"{len(summary['gpus'])} GPU(s) on {', '.join(summary['nodes'])}",
        f"{summary['start']} to {summary['end']} ({summary['duration_seconds'] / 60:.1f} minutes)",
        "",
        f"GPU utilization (mean): {pct(summary['gpu_utilization_mean'])}  ({summary['verdicts']['gpu_utilization']})",
        f"GPU memory peak: {pct(summary['gpu_memory_peak_ratio'])}  ({summary['verdicts']['gpu_memory']})",
        f"SM active: {pct(summary['sm_active_mean'])}  ({summary['verdicts']['sm_active']})",
        "Energy: " + energy_line(summary),
        f"CPU efficiency: {pct(summary['cpu_efficiency'])}",
        *(
            f"{n['node']}: IPC {n['job_instructions_per_cycle']:.2f}"
            + (f", {n['job_flops_mean'] / 1e9:.1f} GFLOP/s" if n.get("job_flops_mean") is not None else "")
            for n in summary["node_summary"]
            if n.get("job_instructions_per_cycle") is not None
        ),
        f"GPU-hours held {summary['gpu_hours_allocated']:.3f}, idle {summary['gpu_hours_idle']:.3f}",
        "",
        "Findings: " + ("; ".join(summary["findings"]) or "none on the CPU side"),
        "Stragglers: "
        + (
            "; ".join(
                f"{g['node']} GPU {g['gpu']}: {straggler_line(g)} ({'; '.join(g['reasons'])})"
                for g in summary["stragglers"]
            )
            or "none"
        ),
        "Live judgements while it ran: " + ("; ".join(map(live_line, summary.get("live_alerts", []))) or "none"),
        f"Thresholds: {summary.get('thresholds_source', 'the master role' + chr(39) + 's defaults')}",
        "",
        *(
            f"{h['node']}: {h.get('cpu_model', '?')}, {h.get('cpus', '?')} CPUs, "
            f"{h['memory_bytes'] / 2**30:.0f} GiB; {h.get('gpus', 'no GPU')}"
            if "memory_bytes" in h
            else f"{h['node']}: {h.get('gpus', 'no GPU')}"
            for h in summary.get("hosts", [])
        ),
        *(
            f"{h['node']}: CPU counters not counted: {', '.join(h['counters_unavailable'])}"
            for h in summary.get("hosts", [])
            if h.get("counters_unavailable")
        ),
    ]
    with PdfPages(path) as document:
        figure = plt.figure(figsize=(8.27, 11.69))
        figure.text(0.08, 0.95, "\n".join(lines), va="top", family="monospace", fontsize=9, wrap=True)
        document.savefig(figure)
        plt.close(figure)
        for first in range(0, len(images), 2):
            figure, axes = plt.subplots(2, 1, figsize=(8.27, 11.69))
            for axis, (_title, png) in zip(axes, images[first : first + 2]):
                axis.imshow(mpimg.imread(io.BytesIO(png), format="png"))
                axis.set_axis_off()
            for axis in axes[len(images[first : first + 2]) :]:
                axis.set_axis_off()
            figure.tight_layout()
            document.savefig(figure)
            plt.close(figure)
