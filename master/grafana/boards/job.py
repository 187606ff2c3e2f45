"""The Job dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, Panel

# The job's GPUs, each with the job's labels: the device series joined to the jobs holding their GPU on (instance,
# uuid), as the master's live-job rules record them (job_gpu:<series>, accelmon-live-jobs.yml in the master role's
# templates, at that group's interval). Selected by job id, a panel reads the job's few series at each of its points;
# the join written here read every GPU of the fleet at each (18.4 s for a range of 720 points at 8,000 GPUs).
J = 'job_id=~"$job_id"'


def job_gpus(record: str) -> str:
    return f"job_gpu:{record}{{{J}}}"


def against_job_median(record: str) -> str:
    """Each GPU's series over its job's median at the same moment, the median taken over every GPU of the job (all
    shards' parts of it in a sharded fleet, as the join written here took it): what AccelmonJobStraggler judges on one
    master (1 = with its peers; a straggler sits under 0.9 for clocks, 0.8 for power: the master role's
    accelmon-live-jobs.yml; a shard judges its part of a job against that part's median).
    """
    return f"{job_gpus(record)} / on (job_id) group_left quantile by (job_id) (0.5, {job_gpus(record)})"


JOB_LEGEND = "job {{job_id}} {{node}} GPU {{gpu}}"
DASHBOARD = Dashboard(
    "accelmon-job",
    "accelmon / Job",
    "One batch job's GPUs over time (collector 'jobs', with the role's accelmon_exporter_jobs: slurm or oar): "
    "which GPUs it holds, how busy, how full and how hot they are. Device series are joined to the job on uuid "
    "(the master's job_gpu:* records).",
    [
        Panel("GPUs held", "none", [(f"job_id:accelmon_gpus:count{{{J}}}", "job {{job_id}}")], "stat", 6, 4),
        Panel(
            "GPU utilization (job average)",
            "percentunit",
            [(f"job_id:accelmon_gpu_utilization_ratio:avg{{{J}}}", "job {{job_id}}")],
            "stat",
            6,
            4,
            max=1,
        ),
        Panel(
            "GPU memory (fullest GPU)",
            "percentunit",
            [(f"job_id:accelmon_gpu_memory_used_ratio:max{{{J}}}", "job {{job_id}}")],
            "stat",
            6,
            4,
            max=1,
        ),
        Panel(
            "GPU power (sum)", "watt", [(f"job_id:accelmon_gpu_power_watts:sum{{{J}}}", "job {{job_id}}")], "stat", 6, 4
        ),
        Panel(
            "The job's GPUs",
            "short",
            [(f"accelmon_gpu_job_info{{{J}}}", "{{node}} {{gpu}}")],
            "table",
            24,
            6,
            description="Node, NVML index and UUID of every GPU the job holds, with its user and account.",
        ),
        Panel(
            "Live verdicts (alerts on the job now)",
            "short",
            [(f'ALERTS{{alertname=~"AccelmonJob.*",alertstate="firing",{J}}}', "{{alertname}} {{node}} {{gpu}}")],
            "table",
            24,
            5,
            description="The live judgements of running jobs (docs/jobs.md): a straggler GPU and its likely reason, "
            "GPUs held idle, a hung job, an input-bound job, a job near its memory limit. Empty: nothing found.",
            expect_data=False,
        ),
        Panel(
            "Parts at fault on the job's GPUs' paths",
            "short",
            [
                (
                    f"accelmon:gpu_path_fault and on (instance, uuid) accelmon_gpu_job_info{{{J}}}",
                    "{{node}} GPU {{gpu}}: {{part}} {{device}} {{reason}}",
                )
            ],
            "table",
            24,
            5,
            description="What slows a GPU's collectives beyond the GPU itself (docs/jobs.md, \"Reading a rank's "
            'bandwidth"): its clocks held down, its PCIe link trained narrow, an NVLink link down or erring, the NIC '
            "its traffic leaves by down, trained slow or erring. The straggler's reason and AccelmonNcclSlowPath read "
            "the same. Empty: nothing at fault.",
            expect_data=False,  # a sound job has none
        ),
        Panel(
            "SM clock against the job's median",
            "percentunit",
            [(against_job_median("sm_clock_hertz"), JOB_LEGEND)],
            description="1 = with its peers. A GPU under 0.9 for 5 minutes while the job is busy is a straggler.",
        ),
        Panel(
            "Power against the job's median",
            "percentunit",
            [(against_job_median("power_watts"), JOB_LEGEND)],
            description="1 = with its peers. A GPU under 0.8 for 5 minutes while the job is busy is a straggler.",
        ),
        Panel("GPU utilization", "percentunit", [(job_gpus("utilization:ratio"), JOB_LEGEND)], max=1),
        Panel("GPU memory used", "bytes", [(job_gpus("memory_used_bytes"), JOB_LEGEND)]),
        Panel("GPU power", "watt", [(job_gpus("power_watts"), JOB_LEGEND)]),
        Panel("GPU temperature", "celsius", [(job_gpus("temperature_celsius"), JOB_LEGEND)]),
        Panel(
            "SM active (profiling)",
            "percentunit",
            [(job_gpus("sm_active_ratio"), JOB_LEGEND)],
            max=1,
            description="Where the profiling collector is on for the job's nodes.",
        ),
        Panel(
            "SM clock",
            "hertz",
            [(job_gpus("sm_clock_hertz"), JOB_LEGEND)],
            description="A GPU clocked below its peers holds back a synchronous job.",
        ),
        Panel(
            "The job's share of each GPU (SM time of its processes)",
            "percentunit",
            [(f"accelmon_gpu_job_sm_utilization_ratio{{{J}}}", "job {{job_id}} {{node}} GPU {{gpu}}")],
            max=1,
            description="From NVML's per-process samples (collector gpu_processes): on a GPU shared by several "
            "jobs, each job's own part.",
        ),
        Panel(
            "GPU memory of the job's processes",
            "bytes",
            [(f"accelmon_gpu_job_memory_used_bytes{{{J}}}", "job {{job_id}} {{node}} GPU {{gpu}} {{gpu_instance_id}}")],
        ),
        Panel(
            "CPU cores used and given, per node",
            "short",
            [
                (
                    f"sum by (job_id, node) (rate(accelmon_job_cpu_seconds_total{{{J}}}[$__rate_interval]))",
                    "used {{node}}",
                ),
                (f"sum by (job_id, node) (accelmon_job_cpus_allocated{{{J}}})", "given {{node}}"),
            ],
            description="From the job's cgroup (collector job_resources). GPUs idle while these meet: input-bound.",
        ),
        Panel(
            "CPU efficiency (cores used over given)",
            "percentunit",
            [(f"job_id:accelmon_job_cpu_efficiency:ratio{{{J}}}", "job {{job_id}}")],
            max=1,
        ),
        Panel(
            "Memory: used, peak and limit, per node",
            "bytes",
            [
                (f"accelmon_job_memory_used_bytes{{{J}}}", "used {{node}}"),
                (f"accelmon_job_memory_peak_bytes{{{J}}}", "peak {{node}}"),
                (f"accelmon_job_memory_limit_bytes{{{J}}}", "limit {{node}}"),
                (f"accelmon_job_swap_used_bytes{{{J}}}", "swap {{node}}"),
            ],
            description="Peak near the limit: the job is about to be killed for memory; swap: it pages.",
        ),
        Panel(
            "I/O per node",
            "Bps",
            [
                (
                    f"sum by (job_id, node, direction) (rate(accelmon_job_io_bytes_total{{{J}}}[$__rate_interval]))",
                    "{{direction}} {{node}}",
                )
            ],
        ),
        # NCCL's own view of the job (collector nccl, docs/jobs.md "NCCL RAS"): the rank the others wait for.
        Panel(
            "NCCL: ranks missing or behind",
            "short",
            [
                (f"accelmon_nccl_rank_missing{{{J}}}", "missing rank {{rank}} {{host}} pid {{pid}} GPU {{nvml_dev}}"),
                (
                    f"accelmon_nccl_rank_collectives_behind{{{J}}}",
                    "behind rank {{rank}} {{host}} pid {{pid}} GPU {{nvml_dev}}",
                ),
            ],
            "table",
            12,
            8,
            description="From NCCL's RAS (NCCL 2.24+), asked by the job's first node: ranks that do not answer (dead: "
            "unreachable for 60 s) and ranks whose collective count stands below their communicator's (by how many "
            "operations). A rank behind that stays so is the one a hung job waits for.",
            expect_data=False,  # a job without NCCL, or a healthy one, has none
        ),
        Panel(
            "NCCL: collectives launched per communicator",
            "short",
            [(f"accelmon_nccl_communicator_collectives_max{{{J}}}", "{{communicator}}")],
            width=12,
            description="The highest collective count of each communicator: a hung communicator's stands still.",
            expect_data=False,  # a job without NCCL has none
        ),
        # NCCL Inspector's bandwidth by rank (collector nccl_inspector, docs/jobs.md "NCCL Inspector"): a slow link.
        Panel(
            "NCCL: bus bandwidth by rank",
            "Bps",
            [
                (
                    # One line per rank: its classes (collective, size, algorithm) are compared by the rule, not here.
                    "max without (collective, message_size, algorithm) "
                    f"(accelmon_nccl_bus_bandwidth_bytes_per_second{{{J}}})",
                    "rank {{rank}} {{node}} GPU {{gpu}} ({{communicator}})",
                )
            ],
            width=24,
            description="From NCCL Inspector (NCCL 2.29+, where the job loads it): each rank's bus bandwidth (its "
            "own kernel's time, which includes waiting for its peers). One rank far above the others reaches the "
            "collectives last: the others wait for it (AccelmonNcclRankLate). Every rank low alike: a slow part on "
            "the way, which AccelmonNcclSlowPath names.",
            expect_data=False,  # a job without Inspector has none
        ),
    ],
    [("job_id", "label_values(accelmon_gpu_job_info, job_id)")],
)
