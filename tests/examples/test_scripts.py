"""Launch scripts: `bash -n`, dry-run commands that compose with verl, fail-fast without a GPU run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

SCRIPTS = (
    "chair_mscoco.sh",
    "egpo_function_calling.sh",
    "grpo_function_calling.sh",
    "eval_function_calling.sh",
    "eval_chair_mscoco.sh",
    "egpo_ratio_mixed.sh",
)
TRAINING = {
    "chair_mscoco.sh": "chair_mscoco",
    "egpo_function_calling.sh": "egpo_function_calling",
    "grpo_function_calling.sh": "grpo_function_calling",
}


def run_script(repo_root, name, *args, env=None, cwd=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(repo_root / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or repo_root,
        timeout=120,
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_bash_syntax(repo_root, name):
    result = subprocess.run(["bash", "-n", str(repo_root / "examples" / name)], capture_output=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_dry_run_prints_the_verl_command_and_it_composes(repo_root, compose, tmp_path, name):
    result = run_script(
        repo_root,
        name,
        "--dry-run",
        "trainer.total_epochs=1",
        "trainer.experiment_name=with space",
        env={"DATA_DIR": str(tmp_path), "MODEL_PATH": str(tmp_path / "model"), "N_GPUS": "4"},
    )
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip().splitlines()[-1])
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert argv[argv.index("--config-path") + 1] == str(repo_root / "configs")
    config = argv[argv.index("--config-name") + 1]
    assert config == TRAINING[name]
    overrides = argv[argv.index("--config-name") + 2 :]
    # The caller's overrides come last, unchanged (quoting survives).
    assert overrides[-2:] == ["trainer.total_epochs=1", "trainer.experiment_name=with space"]
    assert f"data.train_files={tmp_path}/train.parquet" in overrides
    assert f"actor_rollout_ref.model.path={tmp_path}/model" in overrides
    cfg = compose(config, overrides)  # what verl would compose from this exact command
    assert cfg.trainer.total_epochs == 1
    assert cfg.trainer.n_gpus_per_node == 4
    # Missing prerequisites are reported, not fatal, in a dry run.
    assert "prerequisite not met" in result.stderr


def test_chair_dry_run_starts_the_service_first(repo_root, tmp_path):
    result = run_script(
        repo_root, "chair_mscoco.sh", env={"DRY_RUN": "1", "DATA_DIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    service = shlex.split(lines[0])
    assert service[1:3] == ["-m", "chair_server"]
    assert service[service.index("--ground-truth") + 1] == f"{tmp_path}/chair_ground_truth.json"
    assert service[service.index("--port") + 1] == "0"
    assert "--ready-file" in service and service[-1] == "&"
    assert "reward.custom_reward_function.reward_kwargs.chair_url=http://127.0.0.1:PORT" in lines[1]


@pytest.mark.parametrize("name", [*sorted(TRAINING), "eval_function_calling.sh"])
def test_fails_fast_without_prerequisites(repo_root, tmp_path, name):
    result = run_script(
        repo_root, name, env={"DATA_DIR": str(tmp_path / "missing"), "DRY_RUN": "0"}
    )
    assert result.returncode == 2
    assert "error:" in result.stderr
    assert "bash examples/quickstart.sh" in result.stderr
    assert result.stdout == ""  # nothing was started


def test_help(repo_root):
    result = run_script(repo_root, "chair_mscoco.sh", "--help")
    assert result.returncode == 0
    assert "usage: bash examples/chair_mscoco.sh" in result.stdout


def test_eval_dry_run_merges_generates_scores_and_tabulates(repo_root, tmp_path):
    ckpt = tmp_path / "ckpt"
    for run, steps in (("grpo", (5, 40)), ("egpo", (100,))):
        for step in steps:
            (ckpt / f"{run}_function_calling" / f"global_step_{step}" / "actor").mkdir(parents=True)
    bfcl = tmp_path / "bfcl"
    bfcl.mkdir()
    (bfcl / "simple.parquet").touch()
    (bfcl / "multiple.parquet").touch()
    result = run_script(
        repo_root,
        "eval_function_calling.sh",
        "--dry-run",
        env={"CKPT_ROOT": str(ckpt), "BFCL_DIR": str(bfcl), "OUT_DIR": str(tmp_path / "out")},
    )
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.strip().splitlines()]
    merges = [c for c in commands if c[1:3] == ["-m", "verl.model_merger"]]
    assert [c[c.index("--local_dir") + 1] for c in merges] == [
        f"{ckpt}/grpo_function_calling/global_step_40/actor",
        f"{ckpt}/egpo_function_calling/global_step_100/actor",
    ]
    generated = [c for c in commands if "generate" in c]
    assert len(generated) == 2 * 3  # two runs x (test split + two BFCL categories)
    table = commands[-1]
    assert table[1:4] == ["-m", "entropyrl.commands.eval.fc", "table"]
    assert f"GRPO={tmp_path}/out/grpo/result.json" in table


def test_evaluate_score_and_table(tmp_path):
    from entropyrl.commands.eval.fc import main

    truth = json.dumps([{"name": "f", "arguments": {"x": 1}}])
    good = '<think>t</think><tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    rows = {
        "grpo": [(good, "test"), ("nope", "test"), ("nope", "bfcl_simple")],
        "egpo": [(good, "test"), (good, "test"), ("nope", "bfcl_simple")],
    }
    for run, items in rows.items():
        path = tmp_path / f"{run}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"response": r, "ground_truth": truth, "data_source": s}) + "\n"
                for r, s in items
            )
        )
        assert (
            main(
                [
                    "score",
                    "--name",
                    run,
                    "--generations",
                    str(path),
                    "--out",
                    str(tmp_path / f"{run}.json"),
                ]
            )
            == 0
        )
    result = json.loads((tmp_path / "egpo.json").read_text())
    assert result["accuracy"] == pytest.approx(2 / 3)
    assert result["by_source"]["test"] == {"n": 2, "accuracy": 1.0}
    out = tmp_path / "table.md"
    main(
        [
            "table",
            "--result",
            f"GRPO={tmp_path / 'grpo.json'}",
            "--result",
            f"EGPO={tmp_path / 'egpo.json'}",
            "--out",
            str(out),
        ]
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "| eval set | n | GRPO | EGPO |"
    assert "| test | 2 | 50.00 | 100.00 |" in lines
    assert "| **overall** | 3 | 33.33 | 66.67 |" in lines
