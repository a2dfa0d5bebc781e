"""The launch scripts' `--smoke`: the real verl trainer (Ray, TransferQueue, FSDP2, the `hf`
rollout, the reward loop, the CHAIR service over HTTP) on this machine's CPU, 2 steps each.

These are the end-to-end evidence for the verl path; they take a few minutes. The per-sample
trace (`ENTROPYRL_TRACE_DIR`) shows that the clip bound and advantage the driver computed for a
sample are the ones the actor's loss used for it.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.clip_schedules import clip_high_from_hallucination
from entropyrl.verl import smoke, trace

pytestmark = pytest.mark.slow
SMOKE_TIMEOUT = 1800


def run_smoke(repo_root: Path, script: str, out: Path, cache: Path, *args: str, env=None):
    full_env = dict(os.environ)
    full_env.update(
        ENTROPYRL_SMOKE_CACHE=str(cache),
        ENTROPYRL_TRACE_DIR=str(out / "trace"),
        CHAIR_CACHE_DIR=str(out / "chair-cache"),
    )
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(repo_root / "examples" / script), "--smoke", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=repo_root,
        timeout=SMOKE_TIMEOUT,
    )


def tail(result: subprocess.CompletedProcess, lines: int = 60) -> str:
    text = (result.stdout or "") + (result.stderr or "")
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """The smoke assets, one folder per test session (tests/verl/test_ranks.py shares it)."""
    cache = tmp_path_factory.getbasetemp() / "smoke-assets"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="module")
def caption_run(repo_root, smoke_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("chair_mscoco_smoke")
    result = run_smoke(repo_root, "chair_mscoco.sh", out, smoke_cache)
    assert result.returncode == 0, tail(result)
    return out, result


@pytest.fixture(scope="module")
def fc_run(repo_root, smoke_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("egpo_fc_smoke")
    result = run_smoke(repo_root, "egpo_function_calling.sh", out, smoke_cache)
    assert result.returncode == 0, tail(result)
    return out, result


@pytest.fixture(scope="module")
def mixed_run(repo_root, smoke_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("egpo_ratio_mixed_smoke")
    result = run_smoke(repo_root, "egpo_ratio_mixed.sh", out, smoke_cache)
    assert result.returncode == 0, tail(result)
    return out, result


def test_caption_smoke_metrics(caption_run):
    out, result = caption_run
    assert "smoke check passed" in result.stdout
    rows = smoke.read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        data = row["data"]
        assert math.isfinite(data["actor/pg_loss"])
        assert math.isfinite(data["critic/score/mean"])
        assert 0.0 <= data["chair/chair_i_mean"] <= 1.0
        assert 0.3 <= data["clip/bound_min"] <= data["clip/bound_max"] <= 0.5
        assert data["chair/scored_samples"] == 16 and data["chair/fallback_samples"] == 0
        for name in ("egpo/bonus/mean", "egpo/entropy/seq_mean", "actor/clip/frac_high"):
            assert math.isfinite(data[name]), name
        # The actor's mean bound (over the samples it trained on) is the driver's mean.
        assert data["actor/clip/high_mean"] == pytest.approx(data["clip/bound_mean"], abs=1e-6)


def test_caption_smoke_wrote_its_resolved_config(caption_run):
    from omegaconf import OmegaConf

    out, _ = caption_run
    config = OmegaConf.load(out / "config.yaml")
    assert config.trainer.v1.trainer_mode == "entropyrl"
    assert config.trainer.n_gpus_per_node == 1
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert config.actor_rollout_ref.rollout.n >= 4
    assert config.algorithm.adv_estimator == "egpo"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_sample_clip"
    mini_batches = (
        config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
    )
    assert mini_batches >= 2  # the clip bound only acts off-policy
    assert config.reward.custom_reward_function.reward_kwargs.chair_url.startswith("http://")


def joined_trace(out: Path) -> tuple[list[dict], dict[tuple[int, str], dict]]:
    driver = trace.read(out / "trace", "driver")
    workers = trace.read(out / "trace", "worker")
    assert driver and workers
    by_key = {(row["step"], row["key"]): row for row in driver if not row["padding"]}
    return workers, by_key


def test_bounds_that_reached_the_loss_are_the_drivers(caption_run):
    """Per sample, in the real run: loss-side bound == driver bound == schedule(CHAIR_i)."""
    from omegaconf import OmegaConf

    out, _ = caption_run
    schedule = OmegaConf.load(out / "config.yaml").algorithm.clip_schedule
    workers, driver = joined_trace(out)
    seen = set()
    for row in workers:
        expected = driver[(row["step"], row["key"])]
        assert row["clip_high"] == pytest.approx(expected["clip_high"], abs=1e-6)
        assert row["advantage"] == pytest.approx(expected["advantage"], abs=1e-6)
        seen.add((row["step"], row["key"]))
    assert seen == set(driver)  # every real sample reached the loss
    chair = torch.tensor(
        [math.nan if r["chair_i"] is None else r["chair_i"] for r in driver.values()]
    )
    bounds = clip_high_from_hallucination(
        chair,
        rule=schedule.rule,
        low=schedule.low,
        high=schedule.high,
        threshold=schedule.threshold,
        direction=schedule.direction,
    )
    assert [r["clip_high"] for r in driver.values()] == pytest.approx(bounds.tolist(), abs=1e-6)
    assert {round(b, 6) for b in bounds.tolist()} <= {0.3, 0.5}


def test_fc_smoke_learns_from_varying_rewards(fc_run):
    out, result = fc_run
    assert "smoke check passed" in result.stdout
    rows = smoke.read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    spread = [r["data"]["critic/advantages/max"] - r["data"]["critic/advantages/min"] for r in rows]
    assert max(spread) > 0  # some group's reward varied
    for row in rows:
        assert math.isfinite(row["data"]["actor/pg_loss"])
        assert "egpo/bonus/mean" in row["data"]
    driver = trace.read(out / "trace", "driver")
    assert len(driver) == 2 * 16 and all(row["clip_high"] is None for row in driver)
    # The text recipe keeps verl's own loss (no per-sample field): no loss-side trace.
    assert not trace.read(out / "trace", "worker")


def test_mixed_smoke_scores_math_and_code_through_the_hybrid_reward(mixed_run):
    out, result = mixed_run
    assert "smoke check passed" in result.stdout
    rows = smoke.read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        data = row["data"]
        assert math.isfinite(data["actor/pg_loss"])
        # the ratio weights stay inside the recipe's [lambda_min, lambda_max]
        assert 0.5 - 1e-6 <= data["egpo/weight/mean"] <= 2.0 + 1e-6
    config = OmegaConf.load(out / "config.yaml")
    assert config.algorithm.adv_estimator == "egpo_ratio"
    assert config.algorithm.entropy.mode == "answer"
    assert config.reward.custom_reward_function.path.endswith("entropyrl.rewards.hybrid")
    driver = trace.read(out / "trace", "driver")
    assert len(driver) == 2 * 16
    # Hydra's own output folder stays inside the run folder
    assert (out / "hydra" / ".hydra" / "config.yaml").is_file()


# -- bad setups get one line, not a traceback -----------------------------------------------------


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def assert_one_line_error(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode == 2, tail(result)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr


def test_smoke_without_verl_says_so(repo_root, tmp_path):
    python = write_executable(tmp_path / "python", '#!/bin/sh\nexec python3 -S "$@"\n')
    result = run_smoke(
        repo_root, "chair_mscoco.sh", tmp_path / "out", tmp_path, env={"PYTHON": str(python)}
    )
    assert_one_line_error(result, "verl is not installed")


def test_smoke_with_another_verl_says_so(repo_root, tmp_path):
    fake = tmp_path / "site" / "verl-0.8.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.8.0\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    result = run_smoke(repo_root, "chair_mscoco.sh", tmp_path / "out", tmp_path, env=env)
    assert_one_line_error(result, "verl 0.8.0 is installed")


def test_gpu_run_without_a_model_says_so(repo_root, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.parquet", "val.parquet", "cider_df.json.gz", "chair_ground_truth.json"):
        (data / name).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'NVIDIA H100'\n")
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        DATA_DIR=str(data),
        MODEL_PATH=str(tmp_path / "no-such-model"),
        HF_HUB_OFFLINE="1",
    )
    result = subprocess.run(
        ["bash", str(repo_root / "examples" / "chair_mscoco.sh")],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=120,
    )
    assert_one_line_error(result, "no-such-model")


def test_cpu_run_without_smoke_points_to_it(repo_root, tmp_path):
    env = dict(os.environ)
    env["PATH"] = ":".join(
        p for p in env["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists()
    )
    result = subprocess.run(
        ["bash", str(repo_root / "examples" / "chair_mscoco.sh")],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo_root,
        timeout=120,
    )
    assert_one_line_error(result, "nvidia-smi not found")
    assert "--smoke" in result.stderr


def test_chair_service_down_at_start_continues_with_the_fallback(
    repo_root, tmp_path, caption_run, smoke_cache
):
    """The service cannot start: the run goes on (here: up to the trainer, which a stand-in
    records) with an address nothing answers, and says so."""
    log = tmp_path / "trainer-args.json"
    python = write_executable(
        tmp_path / "python",
        "#!/bin/sh\n"
        'case " $* " in\n'
        f'  *" verl.trainer.main_ppo "*) python3 -c \'import json, sys; json.dump(sys.argv[1:], open("{log}", "w"))\' "$@"; exit 0 ;;\n'
        '  *" entropyrl.verl.smoke check "*) exit 0 ;;\n'
        "esac\n"
        'exec python3 "$@"\n',
    )
    empty = tmp_path / "empty-coco"
    empty.mkdir()
    result = run_smoke(
        repo_root,
        "chair_mscoco.sh",
        tmp_path / "out",
        smoke_cache,
        env={"PYTHON": str(python), "CHAIR_COCO": str(empty), "CHAIR_TIMEOUT": "60"},
    )
    assert result.returncode == 0, tail(result)
    assert "the CHAIR service did not come up" in result.stderr
    assert "Traceback" not in result.stderr
    args = json.loads(log.read_text())
    urls = [
        a for a in args if a.startswith("reward.custom_reward_function.reward_kwargs.chair_url=")
    ]
    assert urls and urls[-1].endswith("=http://127.0.0.1:9")
