#!/usr/bin/env bash
# The whole test suite: lint, types, unit and end-to-end tests, Molecule scenarios. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check exporters tests bench master molecule
ruff format --check exporters tests bench master molecule
mypy
yamllint -s .
ansible-lint -q
exec python -m pytest "$@"
