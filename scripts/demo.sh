#!/usr/bin/env bash
# Sets up accelmon and runs the stack.
#   ./scripts/demo.sh                   a local simulated cluster: one master and two workers with 8 fake GPUs, 4
#                                       InfiniBand ports and 2 Neuron runtimes each, as podman containers
#                                       (accelmon-demo-*), deployed by ansible/deploy.yaml; then checks that every
#                                       target is up with its data, and exits non-zero saying why if not; then
#                                       runs a 45 s Slurm job on both workers (a real Slurm over the fake GPUs)
#                                       and writes its report; Slurm's health check and Alertmanager run too, so
#                                       a drill (accelmon-drill) shows the whole path from a GPU fault to a
#                                       drained node; Grafana on 127.0.0.1:3000 where its image can be pulled
#   ./scripts/demo.sh -i host.ini [...] your own cluster: ansible-playbook -i host.ini ansible/deploy.yaml [...]
#   ./scripts/demo.sh --down            remove the local simulated cluster (containers, network, state)
# The test suite's cluster is accelmon-cluster-*, with state of its own: running the tests leaves the demo up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"  # .tools: Prometheus binaries (setup.sh)

if [ "${1:-}" = "-i" ]; then
  exec ansible-playbook "$@" ansible/deploy.yaml
fi

export CONTAINERS_CONF="$PWD/molecule/images/containers.conf"
export ACCELMON_CLUSTER=accelmon-demo
export ACCELMON_CLUSTER_PROMETHEUS_PORT=127.0.0.1:9090:9090
export ACCELMON_CLUSTER_ALERTMANAGER=true
export ACCELMON_CLUSTER_ALERTMANAGER_PORT=127.0.0.1:9093:9093
export MOLECULE_EPHEMERAL_DIRECTORY="$PWD/.cache/demo"
# A deployed master's Grafana serves HTTPS with a certificate from the deploy's CA; the demo's, published on this
# host's loopback alone, stays plain HTTP: a browser reaching it as 127.0.0.1 would need the demo's CA imported and
# a certificate naming 127.0.0.1, for a connection that never leaves this machine.
export ACCELMON_CLUSTER_GRAFANA_PLAIN_HTTP=true
export ANSIBLE_FORCE_COLOR=0

if [ "${1:-}" = "--down" ]; then
  molecule destroy -s cluster
  rm -rf "$MOLECULE_EPHEMERAL_DIRECTORY"
  echo "the demo cluster is removed (the images stay, for a quicker next start: podman images | grep accelmon)"
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "usage: $0 [-i INVENTORY [ansible-playbook options]] | [--down]" >&2
  exit 2
fi

# A network left by a run from before the dnsname plugin was installed resolves no names: make it anew.
if podman network exists "$ACCELMON_CLUSTER" \
   && [ "$(podman network inspect "$ACCELMON_CLUSTER" --format '{{.DNSEnabled}}')" != "true" ]; then
  echo "the podman network $ACCELMON_CLUSTER has no name resolution: recreating the demo cluster"
  molecule destroy -s cluster >/dev/null
fi

bash molecule/images/build.sh
# Grafana where its image can be pulled (scripts/demo-grafana.sh); else the demo runs without it and says why.
source scripts/demo-grafana.sh
grafana_password="$MOLECULE_EPHEMERAL_DIRECTORY/secrets/grafana-admin-password"
if demo_grafana "$(demo_grafana_image)" "$MOLECULE_EPHEMERAL_DIRECTORY"; then
  if podman container exists accelmon-demo-master && ! podman port accelmon-demo-master 3000 >/dev/null 2>&1; then
    echo "the demo cluster was made without Grafana's port: remove it ($0 --down) and run $0 again for Grafana" >&2
  fi
  grafana_text="Grafana      http://127.0.0.1:3000   user admin, password in $grafana_password
               (the nine dashboards; the Job dashboard's job_id is the job below)"
else
  export ACCELMON_CLUSTER_GRAFANA=false  # not even the tests' stand-in
  grafana_text="Grafana      NOT SHOWN: $(cat "$MOLECULE_EPHEMERAL_DIRECTORY/grafana-not-shown")
               A real master runs it on port 3000 (deploy.yaml); here the dashboards are only checked against
               this Prometheus (tests/test_master.py). With a registry that serves the image, run $0 again."
fi
started=$(date +%s)
molecule converge -s cluster
if ! python3 scripts/check_cluster.py --url http://127.0.0.1:9090 --timeout 120; then
  echo "the demo is up but not whole (above: what is down and why); remove it with: $0 --down" >&2
  exit 1
fi
if [ "${ACCELMON_CLUSTER_GRAFANA:-}" = true ] \
   && ! python3 scripts/check_grafana.py --url http://127.0.0.1:3000 --password-file "$grafana_password"; then
  echo "Grafana is up but not whole (above: what is wrong); remove the demo with: $0 --down" >&2
  exit 1
fi
# A short Slurm job on both workers: the real Slurm of the simulated cluster (slurmctld on worker-1, 8 GRES GPUs
# per node), whose prolog and epilog the role installed; then its report from Prometheus.
if ! podman exec accelmon-demo-worker-1 sh -c 'command -v sbatch' >/dev/null; then
  echo "this demo cluster was made before it ran Slurm: remove it ($0 --down) and run $0 again" >&2
  exit 1
fi
# Slurm runs accelmon's health check (the role installed it) every 10 s: a worker whose GPU fails is drained.
for worker in accelmon-demo-worker-1 accelmon-demo-worker-2; do
  podman exec "$worker" sh -c "grep -q '^HealthCheckProgram=' /etc/slurm/slurm.conf || printf '%s\n' \
    HealthCheckProgram=/usr/local/sbin/accelmon-slurm-health-check HealthCheckInterval=10 \
    HealthCheckNodeState=ANY >> /etc/slurm/slurm.conf"
done
podman exec accelmon-demo-worker-1 scontrol reconfigure
job=$(podman exec accelmon-demo-worker-1 su alice -c \
  'sbatch --parsable --chdir=/tmp --job-name=demo --nodes=2 --gres=gpu:4 --wrap "srun sleep 45"')
echo "demo: Slurm job $job (user alice) holds 4 GPUs on each worker for 45 s"
for _ in $(seq 1 60); do  # bounded: the job ends after 45 s
  [ -z "$(podman exec accelmon-demo-worker-1 squeue --noheader --jobs "$job" 2>/dev/null)" ] && break
  sleep 2
done
sleep 5  # the last scrape sees the job gone
report_dir="$PWD/.cache/demo-report"
rm -rf "$report_dir"
accelmon-report "$job" --prometheus http://127.0.0.1:9090 --lookback 1h --out "$report_dir"

cat <<MSG

accelmon is running on a simulated cluster (containers accelmon-demo-master, -worker-1, -worker-2),
deployed and checked in $(( $(date +%s) - started )) s:
  Prometheus   http://127.0.0.1:9090   (this host only; from another machine: ssh -L 9090:127.0.0.1:9090 $(id -un)@$(hostname -f 2>/dev/null || hostname)
               then open http://127.0.0.1:9090 there; try accelmon_gpu_power_watts, accelmon_gpu_up == 0)
  exporters    curl -sG http://127.0.0.1:9090/federate --data-urlencode 'match[]={job="accelmon",node="accelmon-demo-worker-1"}'
               (what worker-1's exporter served at the last scrape; the exporters serve HTTPS with basic auth, their
               password only in the master's /etc/prometheus/secrets)
  job report   $report_dir/report.html (and .pdf, data.csv, data.parquet, summary.json) of Slurm job $job
  Slurm        podman exec accelmon-demo-worker-1 su alice -c 'sbatch --chdir=/tmp -N2 --gres=gpu:2 --wrap "srun sleep 60"'
  Alertmanager http://127.0.0.1:9093   (the alerts Prometheus sends; this demo sends them nowhere else)
  Straggler    watch a live straggler (docs/jobs.md, "Live judgements"): a job on both workers, one GPU slowed
    1 job      podman exec accelmon-demo-worker-1 su alice -c 'sbatch --chdir=/tmp -N2 --gres=gpu:2 --wrap "srun sleep 120"'
    2 slow     podman exec accelmon-demo-worker-2 sh -c 'echo 3 > /opt/fake-nvml/slow'   (NVML's GPU 3 there is
               Slurm's GPU 1, held by the job: its SM clock and power drop to 60 %, its power cap is on)
    3 alert    within a minute: AccelmonJobStraggler (reason power_cap) naming the job, worker-2 and GPU 3 at
               http://127.0.0.1:9090/alerts (the demo's straggler window is 10 s), and the Job dashboard's ratios
    4 end      podman exec accelmon-demo-worker-2 rm /opt/fake-nvml/slow; accelmon-report JOB --prometheus
               http://127.0.0.1:9090 names the straggler too (at the thresholds of the deployed rules)
  NIC drill    a straggler its own GPU does not explain, explained by the NIC its traffic leaves by (issue 59):
    1 job      podman exec accelmon-demo-worker-1 su alice -c 'sbatch --chdir=/tmp -w accelmon-demo-worker-2 --gres=gpu:2 --wrap "srun sleep 300"'
    2 slow     podman exec accelmon-demo-worker-2 sh -c 'echo 3 quiet > /opt/fake-nvml/slow'   (NVML's GPU 3 slowed
               with no clock event of its own, as a GPU held back by its network runs)
    3 drill    podman exec accelmon-demo-worker-2 accelmon-drill nic --device mlx5_0   (its NIC:
               accelmon_gpu_nic_nearest_info{node="accelmon-demo-worker-2",gpu="3"}; the port's counters stay real)
    4 alert    within a minute and a half (the path rules run every minute; until then the straggler may show
               reason unknown): AccelmonJobStraggler reason nic_port, device mlx5_0, "DRILL, no real fault" at
               http://127.0.0.1:9090/alerts; the Job dashboard's "Parts at fault" lists it
    5 end      podman exec accelmon-demo-worker-2 sh -c 'accelmon-drill stop --device mlx5_0; rm /opt/fake-nvml/slow'
               then podman exec accelmon-demo-worker-1 scancel JOB
  Game day     rehearse a GPU failure end to end (docs/health.md, "Game day"); nothing else on the node is fooled:
    1 start    podman exec accelmon-demo-worker-2 accelmon-drill start --gpu 2 --check ecc
    2 verdict  podman exec accelmon-demo-worker-2 accelmon-slurm-health-check --dry-run   (the exporter's --scan:
               GPU 2 fails its ecc check, DRILL in the detail; at once)
    3 drained  podman exec accelmon-demo-worker-1 sinfo -R   (the reason says DRILL; within 10 s)
    4 repair   podman exec accelmon-demo-worker-2 accelmon-slurm-health-check   (the node is drained and runs no
               job: the repair loop says "DRILL, nothing done: would reset GPU 2"; in observe mode, the default, a
               real fault says "remediation (observe): would reset GPU 2"; docs/health.md, "From verdict to repair")
    5 alert    http://127.0.0.1:9090/alerts and http://127.0.0.1:9093: AccelmonGpuHealthFailure, drill="true"
               (after its 1 minute), with its runbook: docs/runbooks/AccelmonGpuHealthFailure.md
    6 end      podman exec accelmon-demo-worker-2 accelmon-drill stop   (or it ends by itself in 30 minutes), then
               resume the node (accelmon resumes only what its repair loop repaired, in act mode):
               podman exec accelmon-demo-worker-1 scontrol update NodeName=accelmon-demo-worker-2 State=RESUME
  NCCL hang    rehearse a rank of a job that stops answering NCCL (docs/health.md, "Game day"):
    1 job      podman exec accelmon-demo-worker-1 su alice -c 'sbatch --chdir=/tmp -N2 --gres=gpu:2 --wrap "srun sleep 600"'
    2 drill    podman exec accelmon-demo-worker-1 systemd-run --unit nccl-drill accelmon-drill nccl --job JOB --dead
               (on the job's first node: it stands in for the job's RAS socket, the rank on its first GPU missing)
    3 served   curl -sG http://127.0.0.1:9090/api/v1/query --data-urlencode 'query=accelmon_nccl_rank_missing'
               (within 30 s: rank 0, its GPU's UUID, dead="true"; accelmon_nccl_drill_active says it is a drill)
    4 alert    after 2 minutes: AccelmonNcclRankMissing, drill="true", naming the job, rank, node, GPU and process
    5 end      podman exec accelmon-demo-worker-1 accelmon-drill stop; then scancel JOB
  $grafana_text
Run it again: changes nothing. Stop it with: $0 --down
MSG
