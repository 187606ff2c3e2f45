#!/bin/sh
# accelmon: records which GPUs this Slurm job was given, for the exporter's accelmon_gpu_job_info. Run by slurmd
# as root before the job (Prolog=); the epilog removes the record. It never fails the job: whatever goes wrong is
# logged (syslog tag accelmon-prolog) and it exits 0.
# slurmd runs prologs and epilogs with no search path.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
state_dir=${ACCELMON_JOBS_DIR:-/run/accelmon/jobs}

record() {
    job=$SLURM_JOB_ID
    case $job in
        '' | *[!0-9]*) echo "SLURM_JOB_ID '$job' is not a job id: nothing recorded"; return 0 ;;
    esac
    # Recent Slurm gives UUIDs here, older releases indices (device minor numbers): the exporter takes both.
    gpus=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
    # One line per value: a newline in a value would forge a key.
    clean() { printf '%s' "$1" | tr -d '\n\r' | cut -c1-256; }
    tmp=$(mktemp "$state_dir/.slurm-$job.XXXXXX") || return 1
    {
        echo "scheduler=slurm"
        echo "job_id=$job"
        echo "user=$(clean "${SLURM_JOB_USER:-}")"
        echo "account=$(clean "${SLURM_JOB_ACCOUNT:-}")"
        echo "gpus=$(clean "$gpus")"
    } > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$state_dir/slurm-$job" || { rm -f "$tmp"; return 1; }
}

output=$(record 2>&1) || output="could not record job $SLURM_JOB_ID in $state_dir: $output"
[ -z "$output" ] || logger -t accelmon-prolog -- "$output" 2>/dev/null || true
exit 0
