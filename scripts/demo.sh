#!/usr/bin/env bash
# Sets up accelmon and runs the stack.
#   ./scripts/demo.sh                   a local simulated cluster: one master and two workers with 8 fake GPUs
#                                       each, as podman containers, deployed by ansible/deploy.yaml
#   ./scripts/demo.sh -i host.ini [...] your own cluster: ansible-playbook -i host.ini ansible/deploy.yaml [...]
#   ./scripts/demo.sh --down            stop the local simulated cluster
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

if [ "${1:-}" = "-i" ]; then
  exec ansible-playbook "$@" ansible/deploy.yaml
fi

export CONTAINERS_CONF="$PWD/molecule/images/containers.conf"
if [ "${1:-}" = "--down" ]; then
  exec molecule destroy -s cluster
fi
bash molecule/images/build.sh
molecule converge -s cluster
master_ip=$(podman inspect accelmon-cluster-master \
  --format '{{ range .NetworkSettings.Networks }}{{ .IPAddress }}{{ end }}')
cat <<MSG

accelmon is running on a simulated cluster (containers accelmon-cluster-*):
  Prometheus   http://${master_ip}:9090   (try: accelmon_gpu_up, accelmon_gpu_power_watts)
  exporters    http://<worker-ip>:19470/metrics  (podman inspect accelmon-cluster-worker-1)
  Grafana      not started here: no registry reachable from this machine ships its image; on a real master it
               answers on :3000 (user admin, password printed by the deploy).
Stop it with: ./scripts/demo.sh --down
MSG
