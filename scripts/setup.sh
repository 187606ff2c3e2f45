#!/usr/bin/env bash
# Installs what accelmon's tests and local demo need on a Debian/Ubuntu machine: system packages, then a
# virtualenv (.venv) with the project and its Python tools. Safe to run again; quick when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc libc6-dev python3-venv python3-dev prometheus prometheus-node-exporter
          podman runc debootstrap uidmap slirp4netns fuse-overlayfs iproute2 curl)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  # Debian's prometheus package would start a server on :9090 where systemd runs; we only need its binaries.
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.accelmon-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test,deploy]'
  touch "$stamp"
fi
