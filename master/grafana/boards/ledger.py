"""The Fleet ledger dashboard: where the fleet's GPU-hours went (docs/ledger.md), from the ledger's recorded counts
(the accelmon-ledger rules): every GPU in one state at every evaluation."""

from __future__ import annotations

from panels import Dashboard, Panel

COUNTS = "cluster:accelmon_gpus_by_state:count"
HELD = 'state=~"hung|idle|straggling|productive"'
# GPU-hours over the dashboard's range: the counts' average over it times its length. The account and node counts
# exist only while they are not zero: their sum over the range is divided by the evaluations in it (those of the
# always-present fleet count), which makes their absence count as zero.
EVALUATIONS = f'scalar(count_over_time({COUNTS}{{state="free"}}[$__range]))'
HOURS = "$__range_s / 3600"


def top_hours(count: int, by: str, series: str) -> str:
    """The `count` largest GPU-hours of `series` (a count that exists only while it is not zero), summed by `by`."""
    return f"topk({count}, sum by ({by}) (sum_over_time({series}[$__range])) / {EVALUATIONS} * {HOURS})"


DASHBOARD = Dashboard(
    "accelmon-ledger",
    "accelmon / Fleet ledger",
    "Where the fleet's GPU-hours went: every GPU the fleet had in exactly one state at every evaluation (unreachable, "
    "unhealthy, drained, hung, idle, straggling, productive, free; docs/ledger.md), over the dashboard's time range.",
    [
        Panel(
            "Goodput (productive / all GPU-hours)",
            "percentunit",
            [
                (
                    f'sum(avg_over_time({COUNTS}{{state="productive"}}[$__range]))'
                    f" / sum(avg_over_time({COUNTS}[$__range]))",
                    "goodput",
                )
            ],
            "stat",
            6,
            4,
            description="The share of all GPU-hours that jobs spent working: not hung, idle or straggling.",
            max=1,
        ),
        Panel(
            "Allocation (held / all GPU-hours)",
            "percentunit",
            [(f"sum(avg_over_time({COUNTS}{{{HELD}}}[$__range])) / sum(avg_over_time({COUNTS}[$__range]))", "held")],
            "stat",
            6,
            4,
            description="The share of all GPU-hours that jobs held, whatever they did with them.",
            max=1,
        ),
        Panel(
            "GPUs unreachable now",
            "none",
            [(f'sum({COUNTS}{{state="unreachable"}})', "GPUs")],
            "stat",
            6,
            4,
            description="GPUs the fleet had whose exporter does not answer (a node crashed, hung, rebooting or off "
            "the network): capacity lost that no other state shows.",
        ),
        Panel(
            "GPU-hours by state",
            "short",
            [(f"sum by (state) (avg_over_time({COUNTS}[$__range])) * {HOURS}", "{{state}}")],
            "bargauge",
            6,
            4,
        ),
        Panel(
            "GPUs by state over time",
            "short",
            [(f"sum by (state) ({COUNTS})", "{{state}}")],
            width=24,
            height=8,
            description="Each state's GPUs at each evaluation; they add up to every GPU the fleet had (seen within "
            "the ledger's memory, accelmon_master_ledger_memory), unreachable ones included.",
        ),
        Panel(
            "Top accounts by idle and hung GPU-hours",
            "short",
            [
                (
                    top_hours(10, "account", 'account:accelmon_gpus_by_state:count{state=~"idle|hung"}'),
                    "{{account}}",
                )
            ],
            "table",
            12,
            8,
            description="GPU-hours held by each account's jobs under the idle threshold or hung (AccelmonJobGpuIdle's "
            "and AccelmonJobHung's conditions).",
            expect_data=False,
        ),
        Panel(
            "Top users by idle and hung GPU-hours",
            "short",
            [
                (
                    top_hours(10, "user", 'account:accelmon_gpus_by_state:count{state=~"idle|hung"}'),
                    "{{user}}",
                )
            ],
            "table",
            12,
            8,
            expect_data=False,
        ),
        Panel(
            "GPU-hours lost by node (unreachable, unhealthy, drained)",
            "short",
            [(top_hours(20, "node, state", "node:accelmon_gpus_by_state:count"), "{{node}} {{state}}")],
            "table",
            24,
            8,
            description="GPU-hours of each node's GPUs whose exporter did not answer, that were lost or failing, or "
            "on a node that took no jobs.",
            expect_data=False,  # a healthy fleet loses none
        ),
    ],
)
