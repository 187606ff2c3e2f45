#!/usr/bin/env bash
# Installs what accelmon's tests and local demo need on a Debian/Ubuntu machine, and nothing that runs by itself:
#   - system packages (apt): a C compiler for the fake NVML driver, Python venv support, podman with runc, the CNI
#     dnsname plugin (containers of the simulated cluster find each other by name through it), debootstrap,
#     poppler-utils and chromium (the job report's PDF is rendered to images, its HTML opened in a headless browser),
#     nftables (tests/test_loopback_guard.py loads the loopback guard's rules into a network namespace of its own);
#   - Prometheus, promtool, node_exporter, VictoriaMetrics and vmalert binaries, unpacked from Debian's packages into
#     .tools/ rather than installed: installing the packages would enable and start servers where systemd runs;
#   - a virtualenv (.venv) with the project and its Python tools, and the build backend pyproject.toml pins (the
#     deploy builds the exporter's wheel with it, without network: docs/deploying.md, "Air-gapped clusters").
# Safe to run again; quick when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc libc6-dev python3-venv python3-dev podman runc golang-github-containernetworking-plugin-dnsname
          debootstrap uidmap slirp4netns fuse-overlayfs iproute2 curl poppler-utils chromium nftables)
tool_packages=(prometheus prometheus-node-exporter victoria-metrics prometheus-alertmanager)
tool_binaries=(prometheus promtool prometheus-node-exporter victoria-metrics vmalert prometheus-alertmanager)
tools=.tools

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
need_tools=false
for binary in "${tool_binaries[@]}"; do
  [ -x "$tools/usr/bin/$binary" ] || need_tools=true
done

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ "${#missing[@]}" -gt 0 ] || $need_tools; then
  echo "setup: apt-get update"
  $sudo_cmd apt-get update -q >/dev/null
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if $need_tools; then
  echo "setup: unpacking ${tool_packages[*]} into $tools/ (binaries only, no service)"
  downloads=$(mktemp -d)
  chown _apt "$downloads" 2>/dev/null || true  # apt fetches as its _apt user, which must write there
  (cd "$downloads" && apt-get download -q "${tool_packages[@]}" >/dev/null)
  for deb in "$downloads"/*.deb; do
    dpkg-deb -x "$deb" "$downloads/root"
  done
  mkdir -p "$tools/usr/bin"
  for binary in "${tool_binaries[@]}"; do  # the binaries alone: no configs, units or examples
    cp "$downloads/root/usr/bin/$binary" "$tools/usr/bin/"
  done
  # Debian's Alertmanager reads its default notification templates from there, and will not start without them.
  if [ ! -d /usr/share/prometheus/alertmanager ]; then
    $sudo_cmd mkdir -p /usr/share/prometheus
    $sudo_cmd cp -r "$downloads/root/usr/share/prometheus/alertmanager" /usr/share/prometheus/
  fi
  rm -rf "$downloads"
fi

# Name resolution between the simulated cluster's containers comes from this plugin; without it every scrape
# target is down with "no such host" (podman adds it to a network only if it is there when the network is made).
if [ ! -x /usr/lib/cni/dnsname ]; then
  echo "setup: /usr/lib/cni/dnsname is missing: the simulated cluster's containers could not find each other" >&2
  exit 1
fi

# Grafana's own dashboard model (@grafana/schema of the Grafana we deploy) and the TypeScript compiler that checks
# each generated dashboard against it, pinned by master/grafana/schema-check/package-lock.json.
schema=.tools/grafana-schema
if [ ! -x "$schema/node_modules/.bin/tsc" ] ||
  [ master/grafana/schema-check/package-lock.json -nt "$schema/package-lock.json" ]; then
  if ! command -v npm >/dev/null; then
    echo "setup: npm is missing (Debian: apt-get install npm): the dashboards are checked with Grafana's model" >&2
    exit 1
  fi
  echo "setup: installing Grafana's dashboard model and tsc in $schema"
  mkdir -p "$schema"
  cp master/grafana/schema-check/package.json master/grafana/schema-check/package-lock.json "$schema/"
  (cd "$schema" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.accelmon-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the Python environment in .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test,deploy,report]'
  touch "$stamp"
fi
