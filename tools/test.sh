#!/usr/bin/env bash
# Install what the tests need (idempotent), lint, and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k chair -x`.
#
# The suite runs in TEST_WORKERS processes (pytest-xdist, default 2): the smoke runs are mostly
# process start-up and waiting, so two side by side keep both cores busy. Tests that read the same
# smoke run share an xdist group and run in one worker; each run is made once per session
# (tests/conftest.py). The slowest tests' durations are printed at the end.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"

bash tools/setup.sh dev

echo "== ruff"
"$python" -m ruff check .
"$python" -m ruff format --check .

echo "== pytest"
workers="${TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
fi
"$python" -m pytest "${parallel[@]}" --durations=30 "$@"
