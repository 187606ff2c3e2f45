#!/bin/sh
# accelmon: removes this Slurm job's record (written by the prolog), so its accelmon_gpu_job_info series end with
# it. Run by slurmd as root after the job (Epilog=). It never fails: errors are logged and it exits 0.
# slurmd runs prologs and epilogs with no search path.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
state_dir=${ACCELMON_JOBS_DIR:-/run/accelmon/jobs}
case $SLURM_JOB_ID in
    '' | *[!0-9]*) exit 0 ;;
esac
output=$(rm -f "$state_dir/slurm-$SLURM_JOB_ID" 2>&1) ||
    logger -t accelmon-epilog -- "could not remove job $SLURM_JOB_ID's record: $output" 2>/dev/null || true
exit 0
