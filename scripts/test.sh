#!/usr/bin/env bash
# The whole test suite: lint, types, unit and end-to-end tests, Molecule scenarios. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"  # .tools: Prometheus binaries (setup.sh)
ruff check exporters tests bench master molecule scripts
ruff format --check exporters tests bench master molecule scripts
mypy
yamllint -s .
ansible-lint -q
# Workers run the exporter on their system Python, 3.9 and newer: where a 3.9 interpreter exists (pyenv on our
# machines), the exporter's own tests run on it too (not the master's, Ansible's or the job report's: they run on
# the controller or an operator's machine).
py39=""
for candidate in python3.9 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.9*/bin/python3.9; do
  if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null; then
    py39=$candidate
    break
  fi
done
if [ -n "$py39" ]; then
  [ -x .venv39/bin/python ] || "$py39" -m venv .venv39
  .venv39/bin/pip install -q -e '.[test]'
  .venv39/bin/python -m pytest -q -p no:cacheprovider tests \
    --ignore=tests/test_molecule.py --ignore=tests/test_ansible.py --ignore=tests/test_master.py \
    --ignore=tests/test_report.py --ignore=tests/test_scale.py --ignore=tests/test_store.py \
    --deselect tests/test_registry.py::test_a_toy_collector_reaches_the_roles_config_and_unit
else
  echo "no Python 3.9 here: the exporter's tests run on $(python --version) only"
fi
exec python -m pytest "$@"
