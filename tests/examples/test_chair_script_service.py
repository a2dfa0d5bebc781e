"""examples/chair_mscoco.sh's CHAIR service: supervised, restarted on the same URL when killed
mid-run, stopped with the script.

The script runs for real up to the trainer (its config checks included, with the overrides of a
node without vLLM or flash-attn); stand-ins replace only what needs a GPU machine:
`nvidia-smi`, the doctor check, and verl's trainer, which here kills the real service with
SIGKILL, waits for it to answer again at the URL the script gave it, and records what it saw.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

TRAINER = """
import json, os, signal, sys, time, urllib.request
from pathlib import Path

truth, record = sys.argv[1], sys.argv[2]
prefix = "reward.custom_reward_function.reward_kwargs.chair_url="
url = next(a[len(prefix):] for a in sys.argv if a.startswith(prefix))

def healthy():
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False

def services():
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\\0")
        except OSError:
            continue
        if truth.encode() in argv and b"--parent-pid" in argv:
            found.append(int(proc.name))
    return sorted(found)

def wait(predicate):
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)

assert healthy()
(first,) = services()
os.kill(first, signal.SIGKILL)
wait(lambda: services() not in ([], [first]) and healthy())
(second,) = services()
Path(record).write_text(json.dumps({"url": url, "first": first, "second": second}))
# The supervisor logs the restart once its own health poll sees the new service, which can be
# a moment after this process saw it: leave it that moment before the script stops it.
time.sleep(3)
"""


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


# What a GPU node without vLLM and flash-attn can run (the script checks both first).
NO_VLLM_NO_FLASH = (
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.model.use_remove_padding=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
)


def gpu_node(tmp_path: Path, truth: str, trainer_case: str) -> tuple[dict[str, str], Path]:
    """Inputs and stand-ins of a GPU node for examples/chair_mscoco.sh: dummy data files (only
    checked for presence before the trainer), a CHAIR ground truth `truth`, a model folder,
    nvidia-smi listing one GPU, and a `python` that runs `trainer_case` (a shell command) in
    place of verl's trainer and passes the doctor check. Returns the environment and the
    ground-truth path."""
    data, model, bin_dir, temp = (tmp_path / n for n in ("data", "model", "bin", "tmp"))
    for folder in (data, model, bin_dir, temp):
        folder.mkdir()
    for name in ("train.parquet", "val.parquet", "cider_df.json.gz"):
        (data / name).write_bytes(b"")
    ground_truth = data / "chair_ground_truth.json"
    ground_truth.write_text(truth)
    (model / "config.json").write_text("{}")
    (model / "chat_template.jinja").write_text("{{ messages }}")  # the launch checks it
    write_executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'NVIDIA H100'\n")
    python = write_executable(
        tmp_path / "python",
        "#!/bin/sh\n"
        # matched on the first words: the launcher's own command line holds the trainer's too
        'case "$1 $2 $3" in\n'
        f'  "-m verl.trainer.main_ppo "*) {trainer_case} ;;\n'
        '  "-m entropyrl doctor") exit 0 ;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n',
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(python),
        "DATA_DIR": str(data),
        "MODEL_PATH": str(model),
        "TMPDIR": str(temp),
    }
    return env, ground_truth


def test_killed_service_is_restarted_on_its_url_and_stopped_with_the_script(
    repo_root, tmp_path
) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    record = tmp_path / "record.json"
    truth = tmp_path / "data" / "chair_ground_truth.json"
    env, _ = gpu_node(
        tmp_path,
        json.dumps({"1": ["dog"]}),
        f'exec "{sys.executable}" "{trainer}" "{truth}" "{record}" "$@"',
    )
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            "bash",
            str(repo_root / "examples" / "chair_mscoco.sh"),
            *NO_VLLM_NO_FLASH,
            f"trainer.default_local_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    seen = json.loads(record.read_text())
    url, first, second = seen["url"], seen["first"], seen["second"]
    assert f"CHAIR service: {url} (supervisor pid" in result.stdout
    assert f"CHAIR service at {url} (pid {first}) was killed by SIGKILL" in result.stderr
    assert f"CHAIR service restarted at {url} (pid {second})" in result.stderr
    assert "Traceback" not in result.stderr
    assert gone(second)  # the script's exit stopped the supervisor, which stopped the service
    assert list((tmp_path / "tmp").iterdir()) == []  # its work folder is removed
    # the service's log is kept in the run's folder: both services' start, the supervisor's line
    log = (run_dir / "chair_server.log").read_text()
    assert f"log: {run_dir / 'chair_server.log'})" in result.stdout
    assert log.startswith("== ") and "-m chair_server" in log.splitlines()[0]
    assert log.count("CHAIR server listening") == 2, log


def test_a_service_that_does_not_come_up_stops_the_run_unless_optional(repo_root, tmp_path) -> None:
    """A multi-hour GPU run must not go on as plain GRPO by accident: no CHAIR service, no run,
    unless CHAIR_OPTIONAL=1 asks for the documented fallback."""
    record = tmp_path / "trainer_ran"
    env, _ = gpu_node(tmp_path, "not json", f'echo "$@" > "{record}"; exit 0')  # cannot start
    env["CHAIR_TIMEOUT"] = "5"
    run_dir = tmp_path / "run"
    script = [
        "bash",
        str(repo_root / "examples" / "chair_mscoco.sh"),
        *NO_VLLM_NO_FLASH,
        f"trainer.default_local_dir={run_dir}",
    ]
    run = subprocess.run(script, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2
    assert "error: the CHAIR service did not come up within 5s" in run.stderr
    assert "CHAIR_OPTIONAL=1 trains without it" in run.stderr
    assert "-m chair_server" in (run_dir / "chair_server.log").read_text()  # kept to read
    assert not record.exists()
    optional = subprocess.run(
        script, capture_output=True, text=True, env={**env, "CHAIR_OPTIONAL": "1"}, timeout=300
    )
    assert optional.returncode == 0, optional.stderr[-2000:]
    assert "training continues without CHAIR scores (CHAIR_OPTIONAL=1)" in optional.stderr
    assert "reward.custom_reward_function.reward_kwargs.chair_url=http://" in record.read_text()
