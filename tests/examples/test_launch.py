"""`entropyrl launch`, the Python behind the examples/ scripts: its flags, the overrides it adds,
the GPUs it counts, the CHAIR service it starts and stops, the training command it runs, and the
scripts themselves (each shows its training command, nothing else)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from entropyrl.commands.launch import checks as launch_checks
from entropyrl.commands.launch import recipes as launch_recipes
from entropyrl.commands.launch import service as launch_service
from entropyrl.commands.launch import training as launch_training
from entropyrl.commands.launch.args import Launch, Stop, override_value, parse

REPO = Path(__file__).resolve().parents[2]
COMMAND = ["python3", "-m", "verl.trainer.main_ppo", "--config-name", "chair_mscoco", "a.b=1"]


def stopped(capsys, argv) -> tuple[int, str]:
    with pytest.raises(Stop) as stop:
        parse(argv)
    return stop.value.status, capsys.readouterr().err


def test_flags_overrides_and_the_command_are_told_apart(monkeypatch) -> None:
    monkeypatch.delenv("DRY_RUN", raising=False)
    launch = parse(["s.sh", "--smoke", "--out=o", "--ranks", "2", "x=1", "--", *COMMAND])
    assert (launch.smoke, launch.out, launch.ranks, launch.dry_run) == (True, "o", 2, False)
    assert launch.overrides == ["x=1"] and launch.command == COMMAND
    monkeypatch.setenv("DRY_RUN", "1")
    assert parse(["s.sh", "--", *COMMAND]).dry_run


@pytest.mark.parametrize(
    ("config", "task", "chair"),
    [
        ("chair_mscoco", "caption", True),
        ("egpo_function_calling", "function-calling", False),  # its reward: from the defaults
        ("grpo_function_calling", "function-calling", False),
        ("egpo_ratio_mixed", "mixed", False),
    ],
)
def test_each_recipe_needs_what_its_reward_needs(config, task, chair) -> None:
    recipe = launch_recipes.recipe_for(REPO / "configs", config)
    assert (recipe.task, recipe.chair) == (task, chair)


def test_a_config_over_a_known_reward_needs_no_entry(tmp_path, capsys) -> None:
    (tmp_path / "base.yaml").write_text(
        "reward:\n  custom_reward_function:\n    name: function_calling_score\n"
    )
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - base\n  - _self_\n")
    assert launch_recipes.recipe_for(tmp_path, "mine").task == "function-calling"
    # the file's own keys land at _self_: after base here, so they win
    (tmp_path / "own.yaml").write_text(
        "defaults:\n  - base\n  - _self_\n"
        "reward:\n  custom_reward_function:\n    name: caption_score\n"
    )
    assert launch_recipes.recipe_for(tmp_path, "own").chair
    key = "reward.custom_reward_function.name"
    assert launch_recipes.recipe_for(tmp_path, "own", [f"{key}=hybrid_score"]).task == "mixed"
    with pytest.raises(Stop) as stop:
        launch_recipes.recipe_for(tmp_path, "own", [f"{key}=my_score"])
    assert stop.value.status == 2
    assert "no launch recipe for own's reward.custom_reward_function.name ('my_score')" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["s.sh", "--smoke", "--", *COMMAND], "verl.trainer.main_ppo"),
        (
            ["e.sh", "--", "py", "-m", "entropyrl.commands.eval.caption", "--out", "o"],
            "entropyrl.commands.eval.caption",
        ),
        # an override naming the module is not the command: the last `--` splits them
        (["s.sh", "note=entropyrl.commands.eval.caption", "--", *COMMAND], "verl.trainer.main_ppo"),
        (["s.sh", "a=1", "--", "py", "train.py"], None),
        (["s.sh", "--", "py", "-m"], None),
        (["s.sh"], None),
    ],
)
def test_the_launch_path_is_the_commands_module(argv, module) -> None:
    from entropyrl.commands.launch import launched_module

    assert launched_module(argv) == module


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--dryrun"], "error: unknown option --dryrun (the options: --dry-run, --smoke,"),
        (["--out"], "error: --out needs a folder"),
        (["--ranks"], "error: --ranks needs a number"),
        (["--smoke", "--ranks", "0"], "error: --ranks must be a positive integer, got '0'"),
        (["--out", "x"], "error: --out and --ranks belong to --smoke"),
        (["--", "x=1"], "error: unknown option --"),  # a second `--` is the user's
    ],
)
def test_a_usage_mistake_is_one_line_and_status_2(capsys, args, line) -> None:
    status, err = stopped(capsys, ["s.sh", *args, "--", *COMMAND])
    errors = [e for e in err.splitlines() if e.startswith("error:")]
    assert status == 2 and len(errors) == 1 and errors[0].startswith(line), err


def test_help_is_the_scripts_header(capsys) -> None:
    script = str(REPO / "examples" / "chair_mscoco.sh")
    with pytest.raises(Stop) as stop:
        parse([script, "--help", "--", *COMMAND])
    text = capsys.readouterr().out
    assert stop.value.status == 0
    assert text.startswith("Hallucination-aware captioning on MSCOCO with verl")
    assert "usage: bash examples/chair_mscoco.sh" in text and "set -euo" not in text


def test_the_last_override_wins_as_in_hydra() -> None:
    overrides = ["trainer.nnodes=1", "+trainer.nnodes=2", "trainer.nnodes_x=3"]
    assert override_value("trainer.nnodes", overrides) == "2"
    assert override_value("trainer.save_freq", overrides) == ""


def test_lora_and_experiment_overrides(monkeypatch) -> None:
    problems: list[str] = []
    monkeypatch.setenv("LORA_RANK", "8")
    vision = launch_recipes.lora_overrides("vision", problems.append)
    assert "actor_rollout_ref.model.lora_alpha=16" in vision
    assert vision[-1] == "actor_rollout_ref.model.exclude_modules='.*visual.*'"
    assert not any("exclude" in o for o in launch_recipes.lora_overrides("text", problems.append))
    monkeypatch.setenv("LORA_RANK", "x")
    assert launch_recipes.lora_overrides("text", problems.append) == []
    assert problems == ["LORA_RANK must be a whole number (0: full fine-tuning), got 'x'"]
    monkeypatch.setenv("EXPERIMENT", "penalty")
    monkeypatch.delenv("MODEL_PATH", raising=False)
    penalty = launch_recipes.experiment_overrides()
    assert penalty[-1] == "trainer.experiment_name=chair_mscoco_qwen2_5_vl_3b_penalty"
    monkeypatch.setenv("MODEL_PATH", "/models/Qwen2.5-VL-7B-Instruct")
    seven = launch_recipes.experiment_overrides()
    assert seven[-1] == "trainer.experiment_name=chair_mscoco_qwen2_5_vl_7b_penalty"
    assert launch_recipes.experiment_overrides("Qwen/Qwen3-VL-4B-Instruct")[-1].endswith(
        "=chair_mscoco_qwen3_vl_4b_penalty"
    )
    monkeypatch.setenv("EXPERIMENT", "nope")
    with pytest.raises(Stop):
        launch_recipes.experiment_overrides()


def _nvidia_smi(tmp_path: Path, gpus: int, monkeypatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}'\n" for i in range(gpus)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_gpus_are_counted_as_cuda_sees_them(tmp_path, monkeypatch) -> None:
    _nvidia_smi(tmp_path, 8, monkeypatch)
    monkeypatch.delenv("N_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,,3")
    gpus = launch_checks.require_gpu(pytest.fail)
    assert (gpus.here, gpus.per_node) == (2, "2")
    assert gpus.seen == "nvidia-smi lists 8, CUDA_VISIBLE_DEVICES=0,1,,3 leaves 2"
    monkeypatch.setenv("N_GPUS", "4")
    assert launch_checks.require_gpu(pytest.fail).per_node_from == "N_GPUS=4"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    problems: list[str] = []
    launch_checks.require_gpu(problems.append)
    assert problems == ["no GPU visible (nvidia-smi lists 8, CUDA_VISIBLE_DEVICES=-1 leaves 0)"]


def test_a_prerequisite_is_a_note_in_a_dry_run_and_an_error_otherwise(capsys) -> None:
    Launch("s.sh", COMMAND, dry_run=True).fail("no data")
    assert capsys.readouterr().err == "# dry-run: prerequisite not met: no data\n"
    with pytest.raises(Stop) as stop:
        Launch("s.sh", COMMAND).fail("no data")
    err = capsys.readouterr().err.splitlines()
    assert stop.value.status == 2 and err[0] == "error: no data"
    assert "`bash s.sh --smoke`" in err[1] and "bash examples/quickstart.sh" in err[1]


def _python(tmp_path: Path, doctor: str | None) -> str:
    """A stand-in interpreter whose `entropyrl doctor` says `doctor` (None: nothing wrong)."""
    python = tmp_path / "python"
    verdict = f'echo "{doctor}"; exit 1' if doctor else "exit 0"
    python.write_text(f'#!/bin/sh\ncase " $* " in *" entropyrl doctor "*) {verdict} ;; esac\n')
    python.chmod(0o755)
    return str(python)


def test_a_failed_run_says_when_verl_did_not_load_the_plugin(tmp_path, monkeypatch, capsys):
    """Only the entry point is checked before a run; the fresh `import verl` that proves the
    plugin loads runs when the run failed, and its verdict is the last line."""
    monkeypatch.setenv("PYTHON", _python(tmp_path, "verl did not load the plugin"))
    launch = Launch("s.sh", COMMAND)
    assert launch_training.train(launch, ["sh", "-c", "exit 1"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("error: the entropyrl verl plugin does not load: verl did not load")
    assert launch_training.train(launch, ["sh", "-c", "exit 130"]) == 130  # Ctrl-C: no diagnosis
    assert launch_training.train(launch, ["sh", "-c", "kill -9 $$"]) == 137
    assert launch_training.train(launch, ["sh", "-c", "exit 0"]) == 0
    assert "does not load" not in capsys.readouterr().err
    monkeypatch.setenv("PYTHON", _python(tmp_path, None))
    assert launch_training.train(launch, ["sh", "-c", "exit 1"]) == 1
    assert "does not load" not in capsys.readouterr().err


def test_a_dry_run_prints_the_command_shell_quoted(capsys) -> None:
    launch = Launch("s.sh", COMMAND, dry_run=True)
    assert launch_training.train(launch, ["python3", "-m", "m", "trainer.experiment_name=a b"]) == 0
    assert capsys.readouterr().out == "python3 -m m 'trainer.experiment_name=a b'\n"


def test_the_chair_service_starts_answers_and_stops(tmp_path, monkeypatch) -> None:
    """The supervised service on a free loopback port, its log kept in the run's folder, and
    nothing left once stopped."""
    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.delenv("CHAIR_HOST", raising=False)
    launch = Launch("s.sh", COMMAND)
    values = {"ER_NNODES": "1", "ER_CHECKPOINT_DIR": str(tmp_path / "run")}
    truth = tmp_path / "chair_ground_truth.json"
    truth.write_text('{"1": ["dog"]}')
    source = ["--ground-truth", str(truth)]
    url, service = launch_service.start_chair(launch, source, values, tmp_path)
    assert service is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
    try:
        assert launch_service.healthy(url)
    finally:
        service.stop()
    assert service.process is not None and service.process.poll() is not None
    assert not launch_service.healthy(url)
    log = (tmp_path / "run" / "chair_server.log").read_text()
    assert log.startswith("== ") and "-m chair_server" in log.splitlines()[0]


def test_a_service_other_machines_reach_needs_a_token(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CHAIR_HOST", "192.0.2.2")
    monkeypatch.delenv("CHAIR_SERVER_TOKEN", raising=False)
    launch = Launch("s.sh", COMMAND)
    with pytest.raises(Stop):
        launch_service.start_chair(launch, ["--coco", "c"], {"ER_NNODES": "1"}, tmp_path)
    assert "so it needs a token: export CHAIR_SERVER_TOKEN=" in capsys.readouterr().err


TRAINING = ("chair_mscoco", "egpo_function_calling", "grpo_function_calling", "egpo_ratio_mixed")


@pytest.mark.parametrize("name", TRAINING)
def test_each_training_script_shows_its_command_over_its_config(name) -> None:
    """After its header, a script sets its defaults and runs one command: the launcher, then
    verl's trainer on configs/<name>.yaml."""
    text = (REPO / "examples" / f"{name}.sh").read_text()
    body = [line for line in text.split("set -euo pipefail", 1)[1].splitlines() if line]
    code = [line for line in body if not line.lstrip().startswith("#")]
    assert len(code) <= 16, code
    command = "\n".join(code[code.index(next(c for c in code if c.startswith("exec "))) :])
    assert command.startswith('exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \\')
    assert (
        f'"$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name {name}'
        in command
    )
    assert "source " not in text  # no shell library behind it
