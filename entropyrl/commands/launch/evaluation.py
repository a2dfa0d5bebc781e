"""The evaluation scripts' launch: examples/eval_chair_mscoco.sh (the base model and each
trained run, or with `--smoke` the caption smoke's checkpoint, through `entropyrl eval caption`)
and examples/eval_function_calling.sh (GPUs and the test split checked, then `entropyrl eval fc
compare`)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

from entropyrl.commands.launch.args import Launch, Stop, say, script_help, usage_error
from entropyrl.commands.launch.checks import note_no_gpu, require_file, require_gpu
from entropyrl.commands.launch.recipes import experiment_name, model_short_name

# the EXPERIMENT runs of a comparison set, in the table's order (after the base)
COMPARISONS = (
    "baseline",
    "entropyrl",
    "penalty",
    "reversed",
    "clip_low",
    "token_penalty",
    "token_clip",
)


def option_value(command: Sequence[str], flag: str) -> str:
    """The value after the last `flag` in `command`, or empty."""
    value = ""
    for index, word in enumerate(command[:-1]):
        if word == flag:
            value = command[index + 1]
    return value


def with_option(command: Sequence[str], flag: str, value: str) -> list[str]:
    """`command` with the value after `flag` replaced."""
    words = list(command)
    words[words.index(flag) + 1] = value
    return words


def with_dry_run(command: Sequence[str], module: str) -> list[str]:
    """`command` with `--dry-run` right after `-m module` (and its action, if any)."""
    words = list(command)
    at = words.index(module) + 1
    if module == "entropyrl.commands.eval.fc":
        at += 1
    return [*words[:at], "--dry-run", *words[at:]]


def read_env_file(path: Path) -> dict[str, str]:
    """`export KEY=VALUE` lines (shell-quoted values), as a smoke's smoke.env holds them."""
    values = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"] and len(words) == 2 and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def comparison_runs(model_path: str) -> str:
    """RUNS's default: `NAME=EXPERIMENT_NAME` of the five EXPERIMENT runs of `model_path`'s
    comparison set, as examples/chair_mscoco.sh names them for the same MODEL_PATH."""
    return " ".join(f"{run}={experiment_name(model_path, run)}" for run in COMPARISONS)


def caption_evaluation(launch: Launch, passthrough: Sequence[str]) -> int:
    """examples/eval_chair_mscoco.sh: the base model (MODEL_PATH) and each run of RUNS (by default
    that model's comparison set) that has a checkpoint (CKPT_ROOT/<experiment name>), into a
    folder of that model's; or with --smoke the caption smoke's checkpoint beside its base."""
    module = "entropyrl.commands.eval.caption"
    command = with_dry_run(launch.command, module) if launch.dry_run else list(launch.command)
    if launch.smoke:
        evaluate = launch.command[: launch.command.index(module) + 1]
        evaluate += ["--dry-run"] if launch.dry_run else []
        return caption_smoke_evaluation(launch, evaluate, passthrough)
    base = option_value(command, "--model").partition("=")[2]
    # each model's comparison set in its own results folder (a folder resumes what it holds)
    out = launch.out or f"{option_value(command, '--out')}_{model_short_name(base)}"
    command = with_option(command, "--out", out)
    data = option_value(command, "--data")
    require_file(
        launch,
        f"{data}/test.parquet",
        f"run: entropyrl prepare coco --annotations ... --images ... --out {data}",
    )
    for variable, flag in (
        ("COCO_ANNOTATIONS", "--coco"),
        ("POPE_DIR", "--pope-dir"),
        ("IMAGE_LIST", "--image-list"),
    ):
        if os.environ.get(variable):
            command += [flag, os.environ[variable]]
    root = Path(os.environ.get("CKPT_ROOT") or Path.cwd() / "checkpoints" / "entropyrl")
    runs = os.environ.get("RUNS") or comparison_runs(base)
    for run in runs.split():
        name, _, experiment = run.partition("=")
        if any(root.glob(f"{experiment}/global_step_*/actor")):
            command += ["--model", f"{name}={root / experiment}"]
        else:
            say(
                f"note: no checkpoint under {root / experiment}: {name} left out (train it with "
                f"MODEL_PATH={base} EXPERIMENT={name} bash examples/chair_mscoco.sh, "
                "trainer.save_freq > 0)"
            )
    return subprocess.run([*command, *passthrough]).returncode


def caption_smoke_evaluation(
    launch: Launch, evaluate: list[str], passthrough: Sequence[str]
) -> int:
    """--smoke: on the CPU, the caption smoke's checkpoint (SMOKE_RUN; the caption smoke runs
    first when it has none) beside its base model, on the generated world's held-out images."""
    out = launch.out or "runs/eval_chair_mscoco_smoke"
    run = os.environ.get("SMOKE_RUN") or "runs/chair_mscoco_smoke"
    if not _nonempty(Path(run, "checkpoints", "latest_checkpointed_iteration.txt")):
        trainer = [str(Path(launch.script).parent / "chair_mscoco.sh"), "--smoke", "--out", run]
        say(
            f"smoke: no caption smoke checkpoint in {run}: running bash "
            f"examples/chair_mscoco.sh --smoke --out {run} first"
        )
        if launch.dry_run:
            print(f"bash {shlex.join(trainer)}", flush=True)
        else:
            status = subprocess.run(["bash", *trainer]).returncode
            if status != 0:
                return status
    flags = ["--num-images", "0", "--backend", "transformers"]
    if not Path(run, "smoke.env").is_file():
        # a dry run before the caption smoke ran: its asset folder is not named yet
        assets = f"{run}/assets/<caption assets>"
        data = ["--data", f"{assets}/data", "--coco", f"{assets}/world"]
        models = ["--model", "base=<caption assets>/model"]
        models += ["--model", f"entropyrl={run}/checkpoints"]
        print(shlex.join([*evaluate, "--out", out, *data, *models, *flags]), flush=True)
        return 0
    env = read_env_file(Path(run, "smoke.env"))  # the data, model and environment of that run
    os.environ.update(env)
    models = ["--model", f"base={env['MODEL_PATH']}", "--model", f"entropyrl={run}/checkpoints"]
    data = ["--data", env["DATA_DIR"], "--coco", f"{env['ENTROPYRL_SMOKE_ASSETS']}/world"]
    command = [*evaluate, "--out", out, *data, *models, *flags, *passthrough]
    return subprocess.run(command).returncode


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def function_calling_evaluation(launch: Launch) -> int:
    """examples/eval_function_calling.sh: GPUs and the test split checked, then the comparison
    (`entropyrl.commands.eval.fc compare`)."""
    if launch.overrides:
        launch.fail(f"unexpected arguments: {' '.join(launch.overrides)}")
    gpus = require_gpu(launch.fail)
    require_file(launch, option_value(launch.command, "--data"), "written by entropyrl prepare fc")
    command = list(launch.command)
    if launch.dry_run:
        tp = option_value(command, "--tensor-parallel-size") or "1"
        say(
            f"# dry-run: resources: generation on TP={tp} GPU(s), one model at a time ({gpus.seen})"
        )
        if gpus.here < 1:
            note_no_gpu(gpus, "generation", "")
        command = with_dry_run(command, "entropyrl.commands.eval.fc")
    return subprocess.run(command).returncode


def parse_evaluation(argv: Sequence[str]) -> tuple[Launch, list[str]]:
    """The caption evaluation's flags: --smoke, --dry-run, --out DIR, --help; every other
    argument goes to `entropyrl eval caption`."""
    split = len(argv) - 1 - list(argv)[::-1].index("--")
    launch = Launch(script=argv[0], command=list(argv[split + 1 :]))
    launch.dry_run = os.environ.get("DRY_RUN", "0") == "1"
    passthrough: list[str] = []
    args = iter(argv[1:split])
    for arg in args:
        if arg == "--smoke":
            launch.smoke = True
        elif arg == "--dry-run":
            launch.dry_run = True
        elif arg == "--out":
            launch.out = next(args, None) or usage_error("--out needs a folder")
        elif arg.startswith("--out="):
            launch.out = arg[len("--out=") :]
        elif arg in ("-h", "--help"):
            print(script_help(launch.script))
            raise Stop(0)
        else:
            passthrough.append(arg)
    return launch, passthrough
