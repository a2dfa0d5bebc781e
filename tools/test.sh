#!/usr/bin/env bash
# Install what the tests need (idempotent), lint, and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k chair -x`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"

bash tools/setup.sh dev

echo "== ruff"
"$python" -m ruff check .
"$python" -m ruff format --check .

echo "== pytest"
"$python" -m pytest "$@"
