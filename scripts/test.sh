#!/usr/bin/env bash
# accelmon's tests. Installs what they need first (scripts/setup.sh), then:
#   ./scripts/test.sh            the full suite, what CI runs: lint and types, the unit tier (on Python 3.9 first where
#                                one is installed), the e2e tier (real Prometheus, node_exporter, VictoriaMetrics,
#                                Chromium, Ansible) and the Molecule scenarios on podman systemd hosts
#   ./scripts/test.sh --quick    lint and types, then the unit tier on this Python: no images, servers or containers
#   ./scripts/test.sh [--quick] -- ARGS   ARGS go to pytest (say -k NAME, or a test file)
# The Molecule tier runs beside the others, its scenarios in parallel (pytest-xdist), once the images are built
# (beside set-up, where podman is already installed);
# each tier's time is printed at the end. Tiers are pytest markers (tests/conftest.py says which test is which).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=false
if [ "${1:-}" = "--quick" ]; then
  quick=true
  shift
fi
[ "${1:-}" != "--" ] || shift

started=$SECONDS
timings=()
step() {  # step NAME COMMAND...: runs it, records how long it took, returns its status
  # Called as `step ... || status=$?`, bash turns set -e off inside the function: the status is kept by hand.
  local name=$1 begin=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timings+=("$(printf '%-34s %5d s' "$name" $((SECONDS - begin)))")
  return "$rc"
}
report() {
  echo "--- time by tier ---"
  printf '%s\n' "${timings[@]}"
  printf '%-34s %5d s\n' "total" $((SECONDS - started))
}

# The Molecule tier's images (debootstrap and apt in containers: mostly waiting on the mirror) need podman and
# debootstrap only, not the virtualenv: where the system packages are already there, they build while set-up
# installs the rest (about 2 minutes each from a clean clone), else after it.
images_log=""
images_pid=""
build_images() {  # its last line says whether it succeeded: a sibling shell cannot `wait` for it
  local begin=$SECONDS
  if CONTAINERS_CONF="$PWD/molecule/images/containers.conf" bash molecule/images/build.sh >"$images_log" 2>&1; then
    echo "images built in $((SECONDS - begin)) s" >>"$images_log"
  else
    echo "images failed" >>"$images_log"
  fi
}
$quick || images_log=$(mktemp /tmp/accelmon-images.XXXXXX.log)
if ! $quick && command -v podman >/dev/null && command -v debootstrap >/dev/null; then
  build_images &
  images_pid=$!
  trap 'kill "$images_pid" 2>/dev/null || true' EXIT
fi

step "set-up (scripts/setup.sh)" bash scripts/setup.sh
# ACCELMON_TEST_WORKERS=N runs the unit and e2e tiers on N parallel workers (pytest-xdist; --dist loadgroup keeps a
# module's tests that share a module fixture on one worker, tests/conftest.py). Off by default: on CI's 2 cores
# beside the Molecule tier, 4 workers made the e2e tier slower (1,286 s against 941 s in one process) and starved
# its simulated workers' scrapes (3 e2e tests failed on data that came late).
parallel=(-n "${ACCELMON_TEST_WORKERS:-0}" --dist loadgroup)
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"  # .tools: Prometheus binaries (setup.sh)

molecule_log=""
molecule_pid=""
if ! $quick; then
  # Then every scenario at once: they use their own container names, networks and Molecule state, so they do not
  # meet.
  molecule_log=$(mktemp /tmp/accelmon-molecule.XXXXXX.log)
  (
    if [ -n "$images_pid" ]; then
      while kill -0 "$images_pid" 2>/dev/null; do sleep 1; done
    else
      build_images
    fi
    cat "$images_log"
    tail -1 "$images_log" | grep -q "^images built" || exit 1
    scenarios=$(python -m pytest --collect-only -q -m molecule "$@" 2>/dev/null | grep -c '::' || true)
    exec python -m pytest -p no:cacheprovider -m molecule -n "$(( scenarios > 0 ? scenarios : 1 ))" "$@"
  ) >"$molecule_log" 2>&1 &
  molecule_pid=$!
  molecule_begin=$SECONDS
  # A step that fails ends this script (set -e): the Molecule tier must not go on alone behind it.
  trap '[ -z "$molecule_pid" ] || kill -- "$molecule_pid" 2>/dev/null || true
        [ -z "$images_pid" ] || kill "$images_pid" 2>/dev/null || true' EXIT
fi

lint() {  # chained: inside a function that a caller tests, set -e would not stop at the first failure
  ruff check exporters tests bench master molecule scripts &&
    ruff format --check exporters tests bench master molecule scripts &&
    mypy &&
    yamllint -s . &&
    ansible-lint -q
}
step "lint and types" lint

# Workers run the exporter on their system Python, 3.9 and newer: where a 3.9 interpreter exists (pyenv on our
# machines), the unit tier runs on it first, and what passed there is not run again on this Python (Ansible, the
# master's tools and the job report run on the controller or an operator's machine, which are newer; their tests
# need their packages, absent from this venv, so they are skipped there and run here).
# The few unit tests that touch no worker code (docs, lock files, the bench's arithmetic: 8 of ~50 files) are
# left in the 3.9 run: a test passed there is not run again here, so moving them would only move their time.
py39=""
passed_on_39=""
for candidate in python3.9 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.9*/bin/python3.9; do
  if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null; then
    py39=$candidate
    break
  fi
done
if $quick; then
  echo "quick: the Python 3.9 run is left to the full suite"
elif [ -n "$py39" ]; then
  [ -x .venv39/bin/python ] || "$py39" -m venv .venv39
  .venv39/bin/pip install -q -e '.[test]'
  passed_on_39=$(mktemp /tmp/accelmon-passed39.XXXXXX)
  # On parallel workers (ACCELMON_TEST_WORKERS_39, default 4): the tier is mostly waiting on the processes and
  # servers its tests start (in one process, ~700 s of wall for ~234 CPU-s in CI's rehearsal), which workers overlap.
  # The slow-controller breaker test once ran past its budget here (the fake scontrol's --json refusals, which
  # scontrol makes without the controller, queued behind its latency: tests/support/fake_scontrol.py).
  step "unit tier on Python 3.9" .venv39/bin/python -m pytest -q -p no:cacheprovider -m unit \
    -n "${ACCELMON_TEST_WORKERS_39:-4}" --dist loadgroup --record-passed="$passed_on_39" "$@"
else
  echo "no Python 3.9 here: the exporter's tests run on $(python --version) only"
fi

status=0
if $quick; then
  step "unit tier" python -m pytest -m unit "${parallel[@]}" "$@" || status=$?
  report
  exit "$status"
fi
# What passed on 3.9 is not run again here (the tests that need this Python's packages were skipped there).
step "unit and e2e tiers" python -m pytest -m "unit or e2e" "${parallel[@]}" \
  ${passed_on_39:+--skip-passed="$passed_on_39"} "$@" ||
  status=$?
[ -z "$passed_on_39" ] || rm -f "$passed_on_39"

echo "--- Molecule tier (started beside the others; waiting for it) ---"
molecule_status=0
wait "$molecule_pid" || molecule_status=$?
molecule_pid=""
cat "$molecule_log"
rm -f "$molecule_log" "$images_log"
timings+=("$(printf '%-34s %5d s' "Molecule tier (in parallel)" $((SECONDS - molecule_begin)))")
report
[ "$status" -ne 0 ] || status=$molecule_status
exit "$status"
