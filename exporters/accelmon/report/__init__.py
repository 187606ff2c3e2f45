"""accelmon-report: one batch job's report, from the Prometheus that scrapes its nodes.

    accelmon-report JOB_ID --prometheus http://master:9090 [--out DIR] [--lookback 30d]

Finds the job's window, nodes and GPUs from `accelmon_gpu_job_info` (the jobs collector), queries every metric
over that window (keeping each series under Prometheus's 11,000 points by the step), and writes into DIR:

- `report.html`: a page to read at a glance, opening offline (plots embedded): the job, a jobstats-style summary
  with verdicts, energy, stragglers, and plots per GPU and node over time;
- `report.pdf`: the same, for a ticket;
- `data.csv` and `data.parquet`: the tidy table (time, node, gpu, uuid, metric, value);
- `summary.json`: the summary's figures.

Energy is the increase of each GPU's energy counter over the window (joules and kWh); idle GPU-hours are the
hours a GPU held by the job spent under 5 % utilization. A straggler is a GPU whose utilization, SM activity,
power or SM clock sits below 80 % of the job's median at that moment for at least a quarter of the run; the report
names the likely reason where the metrics show one (clock-event reasons such as thermal or power capping, XID
errors, a lower clock). Needs the `report` extra (matplotlib, pandas, pyarrow, jinja2).

The package, by concern: `query` (Prometheus: the job, its series), `analysis` (pure functions of the tidy table:
the summary, findings, stragglers), `render` (plots, `report.html.j2`, the PDF) and `cli`.
"""

from accelmon.report.analysis import counter_increase, findings, stragglers, summarize
from accelmon.report.cli import main, write_report
from accelmon.report.query import MAX_POINTS, Job, Prometheus, ReportError, step_for
from accelmon.report.render import html, pdf, plots

__all__ = [
    "MAX_POINTS",
    "Job",
    "Prometheus",
    "ReportError",
    "counter_increase",
    "findings",
    "html",
    "main",
    "pdf",
    "plots",
    "step_for",
    "stragglers",
    "summarize",
    "write_report",
]
