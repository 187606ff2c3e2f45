# Sourced by scripts/demo.sh: whether the demo's master runs the real Grafana.
#
# demo_grafana IMAGE STATE_DIR pulls the image the master role deploys (bounded: a registry that does not answer
# stops the demo for 3 minutes at most). Where it can, it exports what molecule/cluster/molecule.yml reads
# (ACCELMON_CLUSTER_GRAFANA=true, the image, port 127.0.0.1:3000) and returns 0; where it cannot, it writes why to
# STATE_DIR/grafana-not-shown (the pull's last line) and returns 1: the demo then runs without Grafana and says so.
# A second run finds the image already here and pulls nothing.
demo_grafana() {
  local image=$1 state=$2 why
  mkdir -p "$state"
  rm -f "$state/grafana-not-shown"
  if ! podman image exists "$image" 2>/dev/null; then
    if ! why=$(timeout 180 podman pull -q "$image" 2>&1 >/dev/null); then
      why=$(printf '%s\n' "$why" | grep -v '^[[:space:]]*$' | tail -n 1)
      printf 'podman pull %s failed: %s\n' "$image" "${why:-timed out after 180 s}" > "$state/grafana-not-shown"
      return 1
    fi
  fi
  export ACCELMON_CLUSTER_GRAFANA=true
  export ACCELMON_CLUSTER_GRAFANA_IMAGE="$image"
  export ACCELMON_CLUSTER_GRAFANA_PORT=127.0.0.1:3000:3000
  return 0
}

# The role's Grafana image (its defaults: the one place it is named).
demo_grafana_image() {
  # The value alone: the line may end in a comment (a yamllint directive for a digest's length).
  sed -n 's/^accelmon_master_grafana_image: *\([^ #]*\).*/\1/p' ansible/roles/accelmon_master/defaults/main.yml
}
