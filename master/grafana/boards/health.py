"""The Health dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, G, N, Panel, gpu_vars

VERDICT = "0 ok, 1 warning, 2 failure."
DASHBOARD = Dashboard(
    "accelmon-health",
    "accelmon / Health",
    "Which GPU is broken and what to do: the health checks' verdicts (docs/health.md), fleet first, then per GPU its "
    "checks, the XIDs of its kernel log by name, and its NVLink links.",
    [
        Panel(
            "Nodes failing",
            "none",
            [("count(node:accelmon_health_verdict:max == 2) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel(
            "Nodes warning",
            "none",
            [("count(node:accelmon_health_verdict:max == 1) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel("GPUs failing", "none", [("sum(node:accelmon_gpus_failing:count)", "GPUs")], "stat", 6, 4),
        Panel(
            "Nodes healthy",
            "none",
            [("count(node:accelmon_health_verdict:max == 0) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel(
            "Fleet by verdict",
            "short",
            [(f"node:accelmon_health_verdict:max{{{N}}}", "{{node}}")],
            "statushistory",
            24,
            6,
            description="Each node's worst verdict over time: " + VERDICT,
        ),
        Panel(
            "What to do: checks that are not ok",
            "short",
            [(f"accelmon_gpu_health_check_state{{{G}}} > 0", "{{node}} GPU {{gpu}} {{check}} {{action}}")],
            "table",
            12,
            8,
            description="Each failing (2) or warning (1) check of a GPU with its action; `accelmon-exporter --scan` on "
            "the node gives the detail.",
        ),
        Panel(
            "Node checks that are not ok",
            "short",
            [(f"accelmon_node_health_check_state{{{N}}} > 0", "{{node}} {{check}} {{action}}")],
            "table",
            12,
            8,
            description="Checks of the node itself: the kernel log unreadable, the Fabric Manager not running.",
            expect_data=False,
        ),
        Panel(
            "Verdict per GPU",
            "short",
            [(f"accelmon_gpu_health_verdict{{{G}}}", "{{node}} GPU {{gpu}}")],
            "statushistory",
            24,
            8,
            description=VERDICT,
        ),
        Panel(
            "XIDs in the kernel log since boot, by name (last seen)",
            "dateTimeAsIso",
            [
                (
                    f"accelmon_gpu_kernel_xid_last_timestamp_seconds{{{G}}} * 1000"
                    " * on (instance, xid) group_left (name, severity, action) accelmon_xid_catalogue_info",
                    "{{node}} GPU {{gpu}} XID {{xid}} {{name}}",
                )
            ],
            "table",
            24,
            7,
            description="Named by the XID catalogue (exporters/accelmon/health/xid.py) with its severity and action.",
        ),
        Panel(
            "NVLink link map (1 up, 0 down)",
            "short",
            [(f"accelmon_gpu_nvlink_link_up{{{G}}}", "{{node}} GPU {{gpu}} link {{link}}")],
            "statushistory",
            24,
            10,
            description="Every NVLink link of the selected GPUs over time; a link down fails its GPU's nvlink check.",
        ),
        Panel(
            "NVLink errors per second",
            "short",
            [
                (
                    f"sum by (node, gpu, link, type) (rate(accelmon_gpu_nvlink_errors_total{{{G}}}[$__rate_interval]))",
                    "{{node}} GPU {{gpu}} link {{link}} {{type}}",
                )
            ],
            width=12,
            description="CRC errors matter from about 100/s (alert AccelmonNvlinkCrcErrors); any replay or recovery "
            "error warns the nvlink check.",
        ),
        Panel(
            "Fabric registration (3 completed)",
            "short",
            [(f"accelmon_gpu_fabric_state{{{G}}}", "{{node}} GPU {{gpu}}")],
            width=12,
            description="1 not started, 2 in progress, 3 completed; NVSwitch systems only.",
        ),
        # From verdict to repair (docs/health.md): what the Slurm health check's breaker and repair loop did.
        Panel(
            "Nodes held by the circuit breaker",
            "none",
            [("count(accelmon_node_drain_held_by_breaker == 1) or vector(0)", "nodes")],
            "stat",
            6,
            4,
            description="Failing nodes the breaker did not drain: they keep taking jobs (AccelmonDrainBreakerHolding).",
        ),
        Panel(
            "Remediation paused",
            "none",
            [("max(accelmon_remediation_paused) or vector(0)", "paused")],
            "stat",
            6,
            4,
            description="1 while `accelmon-remediation pause` is in force: no node drains or repairs "
            "(AccelmonRemediationPaused; `accelmon-remediation status` says who paused it and why).",
            expect_data=False,  # served where the scheduler collector reads Slurm: a fleet without Slurm has none
        ),
        Panel(
            "Failing nodes not drained, by why",
            "short",
            [(f"sum by (why) (accelmon_node_remediation_held{{{N}}} == 1)", "{{why}}")],
            "table",
            6,
            8,
            description="breaker: the limit was reached; uncounted: the nodes could not be listed, so nothing was "
            "drained (fail closed); paused: the pause switch; pace: max_repairs_per_hour was reached.",
            expect_data=False,  # served only while a check holds
        ),
        Panel(
            "Nodes out by accelmon, for how long",
            "s",
            [(f"time() - accelmon_node_out_by_accelmon_since_seconds{{{N}}}", "{{node}}")],
            "table",
            6,
            8,
            description="Each node Slurm shows drained by accelmon, and for how long: what the breaker counts.",
            expect_data=False,  # a fleet with no node out by accelmon has none
        ),
        Panel(
            "Repairs by action and outcome",
            "short",
            [
                (
                    f"sum by (action, outcome) (accelmon_gpu_remediation_repairs_total{{{N}}})",
                    "{{action}} {{outcome}}",
                )
            ],
            "table",
            9,
            8,
            description="Repairs the repair loop carried out (remediation: act), from each node's journal.",
            expect_data=False,  # a fleet whose nodes were never drained by accelmon has none
        ),
        Panel(
            "Repeat offenders: left for hardware service",
            "short",
            [
                (
                    f'sum by (node) (accelmon_node_remediation_events_total{{{N},event="escalated"}}) > 0',
                    "{{node}}",
                )
            ],
            "table",
            9,
            8,
            description="Nodes whose GPU failed again within repeat_window_days of a repair, or whose reset did not "
            "repair it: drained for hardware_service.",
            expect_data=False,  # a fleet whose nodes were never drained by accelmon has none
        ),
        Panel(
            "Mean time to repair per node",
            "s",
            [
                (
                    f"sum by (node) (accelmon_node_remediation_drained_seconds_total{{{N}}})"
                    f' / sum by (node) (accelmon_node_remediation_events_total{{{N},event="resumed"}})',
                    "{{node}}",
                )
            ],
            "table",
            12,
            8,
            description="Seconds drained by accelmon over the drains that ended in a resume (the journal's).",
            expect_data=False,  # a fleet whose nodes were never drained by accelmon has none
        ),
        Panel(
            "Failures per GPU-month",
            "short",
            [
                (
                    f'sum(increase(accelmon_node_remediation_events_total{{{N},event=~"drained|escalated"}}[30d]))'
                    f" / count(accelmon_gpu_up{{{N}}})",
                    "failures per GPU over 30 days",
                )
            ],
            "stat",
            12,
            8,
            description="accelmon's drains over the last 30 days per GPU: 1 / this is the mean time between failures "
            "in GPU-months.",
            expect_data=False,  # a fleet whose nodes were never drained by accelmon has none
        ),
    ],
    gpu_vars(),
)
