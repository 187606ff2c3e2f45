#!/usr/bin/env bash
# Placeholder until the Ansible deploy lands: runs the exporter once over 8 simulated GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from conftest import build_fake_nvml; from pathlib import Path; build_fake_nvml(Path('$work'))"
printf 'gpus 8\nlost 5\n' > "$work/fake.conf"
LD_LIBRARY_PATH="$work" FAKE_NVML_CONFIG="$work/fake.conf" .venv/bin/accelmon-exporter --once
