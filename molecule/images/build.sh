#!/usr/bin/env bash
# Builds the local images the Molecule scenarios run on; no registry is needed (or reachable in CI).
#   localhost/accelmon-debian-base:bookworm  debootstrap of Debian 12 (cached: built once per machine)
#   localhost/accelmon-systemd:bookworm      + systemd as PID 1 and python3
#   localhost/accelmon-master:bookworm       + podman inside, for the master role
#   localhost/accelmon-prometheus:2.42.0     Prometheus from Debian's package, for the master role
#   localhost/accelmon-alertmanager:0.25.0   Alertmanager from Debian's package, likewise
#   localhost/accelmon-grafana-fake:1.0      a stand-in for Grafana's CLI (no registry ships Grafana here)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="$here/containers.conf"

exists() { podman image exists "$1"; }

if ! exists localhost/accelmon-debian-base:bookworm; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -cf "$work/base.tar" .
  # Import from a file: importing from a pipe once produced an empty image.
  podman import "$work/base.tar" localhost/accelmon-debian-base:bookworm >/dev/null
fi

if ! exists localhost/accelmon-systemd:bookworm || [ "$here/Containerfile.systemd" -nt "$here/.systemd.built" ]; then
  podman build -q -t localhost/accelmon-systemd:bookworm -f "$here/Containerfile.systemd" "$here" >/dev/null
  touch "$here/.systemd.built"
fi

if ! exists localhost/accelmon-master:bookworm || [ "$here/Containerfile.master" -nt "$here/.master.built" ]; then
  podman build -q -t localhost/accelmon-master:bookworm -f "$here/Containerfile.master" "$here" >/dev/null
  touch "$here/.master.built"
fi

if ! exists localhost/accelmon-prometheus:2.42.0 || [ "$here/Containerfile.prometheus" -nt "$here/.prometheus.built" ]; then
  podman build -q -t localhost/accelmon-prometheus:2.42.0 -f "$here/Containerfile.prometheus" "$here" >/dev/null
  touch "$here/.prometheus.built"
fi
if ! exists localhost/accelmon-alertmanager:0.25.0 || [ "$here/Containerfile.alertmanager" -nt "$here/.alertmanager.built" ]; then
  podman build -q -t localhost/accelmon-alertmanager:0.25.0 -f "$here/Containerfile.alertmanager" "$here" >/dev/null
  touch "$here/.alertmanager.built"
fi
if ! exists localhost/accelmon-grafana-fake:1.0 || [ "$here/Containerfile.grafana-fake" -nt "$here/.grafana-fake.built" ]; then
  podman build -q -t localhost/accelmon-grafana-fake:1.0 -f "$here/Containerfile.grafana-fake" "$here" >/dev/null
  touch "$here/.grafana-fake.built"
fi
echo "images ready: $(podman images --format '{{.Repository}}:{{.Tag}}' | grep accelmon | tr '\n' ' ')"
