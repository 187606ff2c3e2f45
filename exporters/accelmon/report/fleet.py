"""accelmon-report --fleet: the fleet's ledger over a range (docs/ledger.md), for the people who pay for the GPUs.

    accelmon-report --fleet --from 2026-11-20 --to 2026-11-27 --prometheus http://master:9090 [--out DIR]

Reads the ledger's recorded counts (no new scrape): every GPU in one state at every evaluation, by the fleet, by
account and user, and the lost states by node. Each sample stands for one step of the range query, so a state's
GPU-hours are the sum of its counts times the step; a count that is absent (an account with no GPU in that state)
is zero. Each step reads the last count recorded within it (not Prometheus's five-minute lookback, which would
bridge a gap). The report checks itself: the GPU-hours the fleet had (its GPUs at each step, the nearest recorded
count standing in for a step with none) against those the ledger accounts for, and the gaps (steps with no recorded
states: a master restarted, a shard down) named. Writes into DIR:

- `report.html`: the ledger at a glance, every number explained in a sentence, opening offline (plots embedded);
- `report.pdf`: the same, for a ticket or a finance team;
- `ledger.csv` and `ledger.parquet`: GPU-hours by day, scope (fleet, account, node), account, user, node and state;
- `summary.json`: the figures.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import math
from pathlib import Path
from typing import Any

from accelmon.report.pages import Document
from accelmon.report.query import Prometheus, ReportError, step_for

STATES = ("productive", "straggling", "idle", "hung", "free", "drained", "unhealthy", "unreachable")
HELD = ("productive", "straggling", "idle", "hung")
WASTED_HELD = ("idle", "hung")
MIN_STEP = 60.0  # the rules' evaluation interval is 15-60 s: a finer step would count one evaluation several times
COLOURS = {
    "productive": "#2e7d32",
    "straggling": "#f9a825",
    "idle": "#ef6c00",
    "hung": "#c62828",
    "free": "#90a4ae",
    "drained": "#6a1b9a",
    "unhealthy": "#212121",
    "unreachable": "#b0bec5",
}
MAX_GAPS_NAMED = 10


def parse_time(text: str) -> float:
    """A date (2026-11-20, midnight UTC), an ISO time, or seconds since the epoch."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as error:
        raise ReportError(f"{text!r}: expected a date (2026-11-20), an ISO time or epoch seconds", 2) from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def day_of(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d")


def collect(prometheus: Prometheus, start: float, end: float) -> tuple[list[dict[str, Any]], float]:
    """The ledger's GPU-hours as rows (day, scope, account, user, node, state, gpu_hours), and the step used."""
    step = max(MIN_STEP, step_for(end - start))
    rows: dict[tuple[str, str, str, str, str, str], float] = {}
    queries = {
        "fleet": "cluster:accelmon_gpus_by_state:count",
        "account": "account:accelmon_gpus_by_state:count",
        "node": "node:accelmon_gpus_by_state:count",
    }
    for scope, query in queries.items():
        for series in prometheus.range(within_step(query, step), start, end, step):
            labels = series["metric"]
            state = labels.get("state", "")
            if state not in STATES:
                continue
            for stamp, value in series["values"]:
                key = (
                    day_of(float(stamp)), scope, labels.get("account", ""), labels.get("user", ""),
                    labels.get("node", ""), state,
                )  # fmt: skip
                rows[key] = rows.get(key, 0.0) + float(value) * step / 3600
    table = [
        {"day": k[0], "scope": k[1], "account": k[2], "user": k[3], "node": k[4], "state": k[5], "gpu_hours": v}
        for k, v in sorted(rows.items())
    ]
    return table, step


def within_step(query: str, step: float) -> str:
    """`query`'s last sample within each step: a step with none stays empty (a gap), where a plain range query would
    carry the last sample over Prometheus's five-minute lookback."""
    return f"last_over_time({query}[{int(step)}s])"


def coverage(prometheus: Prometheus, start: float, end: float, step: float) -> dict[str, Any]:
    """The GPU-hours the fleet had over the range and the gaps in the ledger: at each step, the fleet's GPUs are the
    sum of its recorded counts; a step with none is a gap, its GPUs the last recorded step's (the first one's for a
    gap at the start). With no count at all nothing is known of the fleet, and nothing is claimed."""
    answer = prometheus.range(f"sum({within_step('cluster:accelmon_gpus_by_state:count', step)})", start, end, step)
    counted = {round(float(stamp), 3): float(value) for stamp, value in (answer[0]["values"] if answer else [])}
    first = end - math.ceil((end - start) / step) * step  # the range query's points (Prometheus.range)
    stamps = [round(first + k * step, 3) for k in range(round((end - first) / step) + 1)]
    recorded = [t for t in stamps if t in counted]
    had = 0.0
    gaps: list[dict[str, Any]] = []
    last_known = counted[recorded[0]] if recorded else 0.0  # a gap before the first count: the first count's GPUs
    for stamp in stamps:
        if stamp in counted:
            last_known = counted[stamp]
            had += last_known * step / 3600
            continue
        if not recorded:
            continue
        hours = last_known * step / 3600
        had += hours
        if gaps and round(stamp - gaps[-1]["_last"], 3) == round(step, 3):
            gaps[-1].update(_last=stamp, gpu_hours=gaps[-1]["gpu_hours"] + hours)
        else:
            gaps.append({"_first": stamp, "_last": stamp, "gpu_hours": hours})
    named = [
        {"from": iso(g["_first"] - step), "to": iso(g["_last"]), "gpu_hours": g["gpu_hours"]} for g in gaps
    ]  # a step's sample stands for the step before it
    return {"fleet_gpu_hours": had, "gaps": named}


def iso(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat()


def amount(hours: float) -> str:
    """GPU time in a unit that reads right at any size: GPU-hours from 10, GPU-minutes under that, GPU-seconds under
    a tenth of a minute, so that no time that is not zero reads as 0."""
    if not hours or abs(hours) >= 10:
        return f"{hours:,.0f} GPU-hours"
    minutes = hours * 60
    if abs(minutes) >= 10:
        return f"{minutes:,.0f} GPU-minutes"
    if abs(minutes) >= 0.1:
        return f"{minutes:,.1f} GPU-minutes"
    return f"{minutes * 60:,.0f} GPU-seconds" if abs(minutes * 60) >= 0.5 else "under a GPU-second"


def minute(stamp: str) -> str:
    """An ISO time of the summary as a reader wants it: to the minute, with its zone (2026-11-28 01:05 UTC)."""
    moment = datetime.datetime.fromisoformat(stamp).astimezone(datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "n/a"


def summarize(
    table: list[dict[str, Any]], start: float, end: float, step: float, checked: dict[str, Any]
) -> dict[str, Any]:
    fleet = [r for r in table if r["scope"] == "fleet"]
    by_state = {state: sum(r["gpu_hours"] for r in fleet if r["state"] == state) for state in STATES}
    total = sum(by_state.values())
    held = sum(by_state[s] for s in HELD)
    wasted = sum(by_state[s] for s in WASTED_HELD)
    accounts: dict[str, float] = {}
    users: dict[str, float] = {}
    for row in table:
        if row["scope"] == "account" and row["state"] in WASTED_HELD:
            accounts[row["account"]] = accounts.get(row["account"], 0.0) + row["gpu_hours"]
            users[row["user"]] = users.get(row["user"], 0.0) + row["gpu_hours"]
    lost_by_node: dict[str, float] = {}
    for row in table:
        if row["scope"] == "node":
            lost_by_node[row["node"]] = lost_by_node.get(row["node"], 0.0) + row["gpu_hours"]
    top_accounts = sorted(accounts.items(), key=lambda item: -item[1])[:10]
    top_users = sorted(users.items(), key=lambda item: -item[1])[:10]
    top_nodes = sorted(lost_by_node.items(), key=lambda item: -item[1])[:10]
    days = sorted({r["day"] for r in fleet})
    daily = {day: {s: sum(r["gpu_hours"] for r in fleet if r["day"] == day and r["state"] == s) for s in STATES}
             for day in days}  # fmt: skip
    summary: dict[str, Any] = {
        "from": datetime.datetime.fromtimestamp(start, datetime.timezone.utc).isoformat(),
        "to": datetime.datetime.fromtimestamp(end, datetime.timezone.utc).isoformat(),
        "step_seconds": step,
        "gpu_hours": total,
        "fleet_gpu_hours": checked["fleet_gpu_hours"],
        "accounted_gpu_hours": total,
        "gaps": checked["gaps"],
        "gpu_hours_by_state": by_state,
        "goodput": by_state["productive"] / total if total else None,
        "allocation": held / total if total else None,
        "top_accounts_idle_or_hung": [{"account": a, "gpu_hours": h} for a, h in top_accounts],
        "top_users_idle_or_hung": [{"user": u, "gpu_hours": h} for u, h in top_users],
        "top_nodes_lost": [{"node": n, "gpu_hours": h} for n, h in top_nodes],
        "daily": daily,
    }
    summary["sentences"] = sentences(summary, wasted)
    return summary


def sentences(summary: dict[str, Any], wasted: float) -> list[str]:
    """Each number in a sentence a manager can read."""
    total = summary["gpu_hours"]
    hours = summary["gpu_hours_by_state"]
    if not total:
        return ["The ledger holds no GPU in this range: its rules were not running, or the range is outside the data."]
    had = summary["fleet_gpu_hours"]
    said = [
        f"The fleet had {amount(had)} over the range; the ledger accounts for {amount(total)} of them "
        f"({percent(total, had)})."
    ]
    gaps = summary["gaps"]
    for gap in gaps[:MAX_GAPS_NAMED]:
        said.append(
            f"No state was recorded from {minute(gap['from'])} to {minute(gap['to'])}: {amount(gap['gpu_hours'])} "
            "the ledger cannot place (the master or its rules were not running, or a shard was down)."
        )
    if len(gaps) > MAX_GAPS_NAMED:
        rest = sum(g["gpu_hours"] for g in gaps[MAX_GAPS_NAMED:])
        said.append(f"{len(gaps) - MAX_GAPS_NAMED} more gaps: {amount(rest)} (summary.json lists them).")
    said += [
        f"Of {amount(total)}, {amount(hours['productive'])} ({percent(hours['productive'], total)}) did useful "
        "work: held by jobs that were neither hung, idle nor straggling. That is the fleet's goodput.",
        f"Jobs held {amount(sum(hours[s] for s in HELD))} ({percent(sum(hours[s] for s in HELD), total)}, "
        "the allocation); the rest were free for new jobs or out of service.",
    ]
    if wasted:
        top = summary["top_accounts_idle_or_hung"]
        lead = f"; account {top[0]['account']} {percent(top[0]['gpu_hours'], wasted)} of it" if top else ""
        said.append(
            f"{amount(wasted)} of {amount(total)} ({percent(wasted, total)}) were held by jobs that used them "
            f"under the idle threshold or hung{lead}."
        )
    if hours["straggling"]:
        said.append(
            f"{amount(hours['straggling'])} ({percent(hours['straggling'], total)}) ran slower than the rest "
            "of their job (stragglers): a synchronous job waits for its slowest GPU."
        )
    lost = hours["unhealthy"] + hours["drained"] + hours["unreachable"]
    if lost:
        nodes = summary["top_nodes_lost"]
        where = f"; most on {nodes[0]['node']} ({amount(nodes[0]['gpu_hours'])})" if nodes else ""
        said.append(
            f"{amount(lost)} ({percent(lost, total)}) were lost to failing GPUs ({amount(hours['unhealthy'])}), "
            f"to nodes out of service ({amount(hours['drained'])}) and to nodes that did not answer "
            f"({amount(hours['unreachable'])}){where}."
        )
    said.append(f"{amount(hours['free'])} ({percent(hours['free'], total)}) were free: no job asked for them.")
    return said


def plots(summary: dict[str, Any]) -> list[tuple[str, bytes]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    days = list(summary["daily"])
    if days:
        figure, axes = plt.subplots(figsize=(10, 4))
        bottom = [0.0] * len(days)
        for state in STATES:
            values = [summary["daily"][day][state] for day in days]
            axes.bar(days, values, bottom=bottom, label=state, color=COLOURS[state])
            bottom = [b + v for b, v in zip(bottom, values)]
        axes.set_ylabel("GPU-hours")
        axes.set_title("GPU-hours by state, per day")
        axes.legend(loc="upper left", bbox_to_anchor=(1, 1))
        figure.autofmt_xdate()
        figure.tight_layout()
        out.append(("GPU-hours by state, per day", save(figure, plt)))
    accounts = summary["top_accounts_idle_or_hung"]
    if accounts:
        figure, axes = plt.subplots(figsize=(10, 3))
        axes.barh([a["account"] or "(none)" for a in accounts][::-1], [a["gpu_hours"] for a in accounts][::-1])
        axes.set_xlabel("GPU-hours held idle or hung")
        axes.set_title("Top accounts by idle and hung GPU-hours")
        figure.tight_layout()
        out.append(("Top accounts by idle and hung GPU-hours", save(figure, plt)))
    return out


def save(figure: Any, plt: Any) -> bytes:
    image = io.BytesIO()
    figure.savefig(image, format="png")
    plt.close(figure)
    return image.getvalue()


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Fleet ledger {{ s.from[:10] }} to {{ s.to[:10] }}</title>
<style>body{font-family:sans-serif;max-width:60rem;margin:2rem auto}td,th{padding:.2rem .6rem;text-align:right}
td.l,th.l{text-align:left}table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style></head>
<body>
<h1>Fleet ledger</h1>
<p>{{ minute(s.from) }} to {{ minute(s.to) }}; where every GPU-hour went (docs/ledger.md).</p>
<ul>{% for line in s.sentences %}<li>{{ line }}</li>{% endfor %}</ul>
<h2>GPU-hours by state</h2>
<table><tr><th class="l">state</th><th>GPU-hours</th><th>share</th></tr>
{% for state, hours in s.gpu_hours_by_state.items() %}<tr><td class="l">{{ state }}</td>
<td>{{ "{:,.1f}".format(hours) }}</td><td>{{ share(hours) }}</td></tr>{% endfor %}</table>
{% for title, data in images %}<h2>{{ title }}</h2><img alt="{{ title }}" src="data:image/png;base64,{{ data }}">
{% endfor %}
<h2>Top users by idle and hung GPU-hours</h2>
{% if s.top_users_idle_or_hung %}<table><tr><th class="l">user</th><th>GPU-hours</th></tr>
{% for u in s.top_users_idle_or_hung %}<tr><td class="l">{{ u.user }}</td><td>{{ "{:,.1f}".format(u.gpu_hours) }}</td>
</tr>{% endfor %}</table>{% else %}<p>None: no job held a GPU idle or hung.</p>{% endif %}
<h2>GPU-hours lost by node (unreachable, unhealthy, drained)</h2>
{% if s.top_nodes_lost %}<table><tr><th class="l">node</th><th>GPU-hours</th></tr>
{% for n in s.top_nodes_lost %}<tr><td class="l">{{ n.node }}</td><td>{{ "{:,.1f}".format(n.gpu_hours) }}</td></tr>
{% endfor %}</table>{% else %}<p>None.</p>{% endif %}
<p><small>accelmon-report --fleet; data: {{ prometheus }}, the ledger's recorded counts at a {{ s.step_seconds|int }} s
step.</small></p>
</body></html>
"""


def html(summary: dict[str, Any], images: list[tuple[str, bytes]], prometheus: str) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True)  # account and user names come from job records
    encoded = [(title, base64.b64encode(png).decode()) for title, png in images]
    total = summary["gpu_hours"]
    return environment.from_string(PAGE).render(
        s=summary, images=encoded, prometheus=prometheus, share=lambda hours: percent(hours, total), minute=minute
    )


def pdf(summary: dict[str, Any], images: list[tuple[str, bytes]], path: Path, paper: str = "a4") -> int:
    """The same report as the HTML page, laid out on A4 or Letter pages, numbered; how many pages."""
    total = summary["gpu_hours"]
    document = Document(paper)
    document.title("Fleet ledger")
    document.paragraph(f"{minute(summary['from'])} to {minute(summary['to'])}; where every GPU-hour went.")
    for sentence in summary["sentences"]:
        document.paragraph(sentence, bullet=True)
    document.heading("GPU-hours by state")
    document.table(["state", "GPU-hours", "share"],
                   [[state, f"{hours:,.1f}", percent(hours, total)]
                    for state, hours in summary["gpu_hours_by_state"].items()])  # fmt: skip
    for title, png in images:
        document.heading(title)
        document.image(png, int.from_bytes(png[20:24], "big") / int.from_bytes(png[16:20], "big"))  # PNG's IHDR
    for title, key, name, empty in (
        ("Top users by idle and hung GPU-hours", "top_users_idle_or_hung", "user", "None: no job held a GPU idle or "
         "hung."),
        ("GPU-hours lost by node (unreachable, unhealthy, drained)", "top_nodes_lost", "node", "None."),
    ):  # fmt: skip
        document.heading(title)
        rows = [[row[name], f"{row['gpu_hours']:,.1f}"] for row in summary[key]]
        if rows:
            document.table([name, "GPU-hours"], rows)
        else:
            document.paragraph(empty)
    document.paragraph(f"accelmon-report --fleet; the ledger's recorded counts at a {int(summary['step_seconds'])} s "
                       "step (docs/ledger.md).")  # fmt: skip
    return document.save(path)


def write_fleet_report(
    prometheus: Prometheus, start: float, end: float, out: Path, paper: str = "a4"
) -> dict[str, Any]:
    import pandas

    if end <= start:
        raise ReportError("--to must be after --from", 2)
    table, step = collect(prometheus, start, end)
    summary = summarize(table, start, end, step, coverage(prometheus, start, end, step))
    images = plots(summary)
    out.mkdir(parents=True, exist_ok=True)
    frame = pandas.DataFrame(table, columns=["day", "scope", "account", "user", "node", "state", "gpu_hours"])
    frame.to_csv(out / "ledger.csv", index=False)
    frame.to_parquet(out / "ledger.parquet", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.html").write_text(html(summary, images, prometheus.url), encoding="utf-8")
    pdf(summary, images, out / "report.pdf", paper)
    return summary
