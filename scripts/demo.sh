#!/usr/bin/env bash
# Sets up accelmon and runs the stack.
#   ./scripts/demo.sh                   a local simulated cluster: one master and two workers with 8 fake GPUs, 4
#                                       InfiniBand ports and 2 Neuron runtimes each, as podman containers
#                                       (accelmon-demo-*), deployed by ansible/deploy.yaml; then checks that every
#                                       target is up with its data, and exits non-zero saying why if not; then
#                                       runs a 45 s Slurm job on both workers (a real Slurm over the fake GPUs)
#                                       and writes its report
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
export MOLECULE_EPHEMERAL_DIRECTORY="$PWD/.cache/demo"
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
started=$(date +%s)
molecule converge -s cluster
if ! python3 scripts/check_cluster.py --url http://127.0.0.1:9090 --timeout 120; then
  echo "the demo is up but not whole (above: what is down and why); remove it with: $0 --down" >&2
  exit 1
fi
# A short Slurm job on both workers: the real Slurm of the simulated cluster (slurmctld on worker-1, 8 GRES GPUs
# per node), whose prolog and epilog the role installed; then its report from Prometheus.
if ! podman exec accelmon-demo-worker-1 sh -c 'command -v sbatch' >/dev/null; then
  echo "this demo cluster was made before it ran Slurm: remove it ($0 --down) and run $0 again" >&2
  exit 1
fi
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
  exporters    podman exec accelmon-demo-master curl -s http://accelmon-demo-worker-1:19470/metrics
  job report   $report_dir/report.html (and .pdf, data.csv, data.parquet, summary.json) of Slurm job $job
  Slurm        podman exec accelmon-demo-worker-1 su alice -c 'sbatch --chdir=/tmp -N2 --gres=gpu:2 --wrap "srun sleep 60"'
  Grafana      not started here: Grafana runs on a real master (deploy.yaml, port 3000). This machine reaches no
               container registry that ships Grafana's image, and Debian does not package Grafana, so the
               dashboards are only checked here against this Prometheus (tests/test_master.py).
Run it again: changes nothing. Stop it with: $0 --down
MSG
