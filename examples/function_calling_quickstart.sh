#!/usr/bin/env bash
# Text EGPO quick start: a tiny Qwen2 learns a synthetic tool-use task (3 tools, strict binary
# reward: <think> block + exact <tool_call> JSON), then GRPO and EGPO run from the same warm-up.
#
#   bash examples/function_calling_quickstart.sh
#   bash examples/function_calling_quickstart.sh --compare grpo,egpo,egpo_ratio --steps 60
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
exec "$python" -m entropyrl demo --task function-calling --out runs/function-calling \
  --warmup-steps 300 --steps 30 "$@"
