"""The launch scripts' `--smoke`: the recipe itself through the real verl trainer (Ray,
TransferQueue, FSDP2, the `hf` rollout, the reward loop, the CHAIR service over HTTP) on this
machine's CPU.

These are the end-to-end evidence for the verl path; they take minutes. In CI:
- the caption recipe (grpo, per-sample clip, remove-padding, gradient checkpointing, validation,
  checkpoints), killed with SIGKILL after its step-2 checkpoint and started again with the same
  command: it resumes and finishes step 3; the same folder then refuses another estimator and
  says a finished run has nothing left to do; its checkpoint merges into a Hugging Face model;
- the function-calling recipe (egpo, dynamic batch sizes) and the mixed recipe (egpo_ratio);
With ENTROPYRL_FULL_SMOKE=1 also: `entropy_adv`, the GRPO function-calling recipe, and a run
that shows the fall-backs (no entropy: plain GRPO; CHAIR service down: the neutral bound).
`maxent_grpo` runs in tests/verl/test_ranks.py (1 and 2 ranks, reading the reference's
log-probs). Every run's own check (`entropyrl.commands.smoke_check`) recomputes a step's advantages
from the trace, and its config differs from the recipe's only in the allowed keys.
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.commands import smoke
from entropyrl.commands.eval_generation import read_rows
from entropyrl.commands.smoke_check import read_metrics
from entropyrl.verl import trace

pytestmark = pytest.mark.slow
SMOKE_TIMEOUT = 1800
FULL_SMOKE_ENV = "ENTROPYRL_FULL_SMOKE"


def run_smoke(repo_root: Path, script: str, out: Path, cache: Path, *args: str, env=None):
    return subprocess.run(
        smoke_command(repo_root, script, out, *args),
        capture_output=True,
        text=True,
        env=smoke_env(cache, out, env),
        cwd=repo_root,
        timeout=SMOKE_TIMEOUT,
    )


def smoke_command(repo_root: Path, script: str, out: Path, *args: str) -> list[str]:
    return ["bash", str(repo_root / "examples" / script), "--smoke", "--out", str(out), *args]


def smoke_env(cache: Path, out: Path, extra=None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ENTROPYRL_SMOKE_CACHE=str(cache), CHAIR_CACHE_DIR=str(out / "chair-cache"))
    env.update(extra or {})
    return env


def tail(result: subprocess.CompletedProcess, lines: int = 60) -> str:
    text = (result.stdout or "") + (result.stderr or "")
    return "\n".join(text.splitlines()[-lines:])


def full_smoke() -> None:
    if os.environ.get(FULL_SMOKE_ENV) != "1":
        pytest.skip(
            f"runs with {FULL_SMOKE_ENV}=1 (before a release; the CI budget takes the rest)"
        )


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """The smoke assets, one folder per test session (tests/verl/test_ranks.py shares it)."""
    cache = tmp_path_factory.getbasetemp() / "smoke-assets"
    cache.mkdir(exist_ok=True)
    return cache


RESUMED_STEPS = ("trainer.total_training_steps=3", "trainer.save_freq=1")


def step_logged(metrics: Path, step: int) -> bool:
    """Whether the file logger has written `step`'s training row (verl saves a step's
    checkpoint before it logs the step, so a kill in between loses that row for good); a line
    the logger is still writing is left out."""
    return any(
        row.get("step") == step and "critic/score/mean" in row.get("data", {})
        for row in read_rows(metrics)
    )


def run_until_checkpoint(command: list[str], env: dict, out: Path, step: int) -> int:
    """Start the smoke, SIGKILL its trainer (the whole process group) once the checkpoint of
    `step` is complete and the step is logged, and return the script's exit status."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    latest = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + SMOKE_TIMEOUT
    try:
        while time.monotonic() < deadline and process.poll() is None:
            saved = latest.is_file() and latest.read_text().strip()
            if saved == str(step) and step_logged(out / "metrics.jsonl", step):
                os.killpg(int((out / "trainer.pid").read_text()), signal.SIGKILL)
                break
            assert saved in (False, "", *map(str, range(step + 1))), f"ran past step {step}"
            time.sleep(0.2)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    (out / "killed_run.log").write_bytes(output or b"")
    return process.returncode


@pytest.fixture(scope="module")
def caption_run(repo_root, smoke_cache, tmp_path_factory):
    """The caption smoke killed after its step-2 checkpoint, then the same command again."""
    out = tmp_path_factory.mktemp("chair_mscoco_smoke")
    command = smoke_command(repo_root, "chair_mscoco.sh", out, *RESUMED_STEPS)
    env = smoke_env(smoke_cache, out)
    killed = run_until_checkpoint(command, env, out, step=2)
    assert killed != 0, (out / "killed_run.log").read_text()[-3000:]
    killed_rows = read_metrics(out / "metrics.jsonl")
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=repo_root, timeout=SMOKE_TIMEOUT
    )
    assert result.returncode == 0, tail(result)
    return out, result, killed_rows


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


def load_smoke_config_module():
    import importlib.util

    path = Path(__file__).with_name("test_smoke_config.py")
    spec = importlib.util.spec_from_file_location("smoke_config_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the caption recipe: resumed after a kill ---------------------------------------------------


def test_a_killed_caption_smoke_resumes_where_it_stopped(caption_run):
    out, result, killed_rows = caption_run
    # the killed run's steps, after its validation before training (step 0)
    assert [row["step"] for row in killed_rows][:3] == [0, 1, 2]
    assert "resuming the run in" in result.stderr and "after step 2" in result.stderr
    assert "smoke check passed: 3 steps" in result.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for before, after in zip(killed_rows[1:3], rows[1:3]):  # kept, not trained again
        assert before["data"]["critic/score/mean"] == after["data"]["critic/score/mean"]
    # the resumed run validated again before going on: its row joins step 2's
    assert "val-core/coco_caption/reward/mean@1" in rows[2]["data"]
    runs = {row["step"]: row["run"] for row in trace.read(out / "trace", "driver")}
    assert runs[1] == runs[2] != runs[3]  # step 3 by the second run only
    # the terminal shows one line per step and the verdict, not verl's console
    assert "target_num_threads" not in result.stdout + result.stderr
    assert "step 3  reward=" in result.stdout
    assert (out / "run.log").stat().st_size > 0


def test_caption_smoke_runs_the_recipe(caption_run):
    out, _, _ = caption_run
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "caption")
    model = config.actor_rollout_ref.model
    assert model.use_remove_padding and model.enable_gradient_checkpointing
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_sample_clip"
    assert json.loads((Path(model.path) / "config.json").read_text())["model_type"] == "qwen2_5_vl"


def test_caption_smoke_validates_and_checkpoints(caption_run):
    out, _, _ = caption_run
    rows = read_metrics(out / "metrics.jsonl")
    last = rows[-1]["data"]
    assert math.isfinite(last["val-core/coco_caption/reward/mean@1"])
    for name in ("chair_i", "chair_s", "recall", "cider"):
        assert math.isfinite(last[f"val-aux/coco_caption/{name}/mean@1"]), name
    assert last["val-aux/coco_caption/chair_unscored/count"] == 0
    folder = out / "checkpoints"
    assert sorted(p.name for p in folder.glob("global_step_*")) == [
        "global_step_2",
        "global_step_3",
    ]
    assert rows[0]["step"] == 0  # validation before training: the step-0 reference
    assert math.isfinite(rows[0]["data"]["val-aux/coco_caption/chair_i/mean@1"])
    for row in rows[1:]:
        assert row["data"]["chair/fallback_samples"] == 0
        assert row["data"]["training/rollout_probs_diff_mean"] < 0.02


def test_bounds_that_reached_the_loss_are_the_drivers(caption_run):
    """Per sample, in the real run: loss-side bound and advantages == the driver's, and every
    real sample of each step reached the loss."""
    out, _, _ = caption_run
    driver = {
        (row["step"], row["key"]): row
        for row in trace.read(out / "trace", "driver")
        if not row["padding"]
    }
    workers = trace.read(out / "trace", "worker")
    assert workers
    seen = set()
    for row in workers:
        expected = driver[(row["step"], row["key"])]
        assert row["clip_high"] == pytest.approx(expected["clip_high"], abs=1e-6)
        assert row["advantage"] == pytest.approx(expected["advantage"], abs=1e-6)
        seen.add((row["step"], row["key"]))
    assert seen == set(driver)
    assert {round(row["clip_high"], 6) for row in driver.values()} <= {0.3, 0.5}


def test_a_finished_run_says_so_and_another_estimator_is_refused(
    repo_root, caption_run, smoke_cache
):
    out, _, _ = caption_run
    env = smoke_env(smoke_cache, out)
    size = (out / "run.log").stat().st_size
    again = subprocess.run(
        smoke_command(repo_root, "chair_mscoco.sh", out, *RESUMED_STEPS),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, tail(again)
    assert "nothing left to do" in again.stderr
    assert (out / "run.log").stat().st_size == size  # nothing started
    other = subprocess.run(
        smoke_command(
            repo_root, "chair_mscoco.sh", out, *RESUMED_STEPS, "algorithm.adv_estimator=egpo"
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert other.returncode == 2
    (line,) = [x for x in other.stderr.splitlines() if x.startswith("error:")]
    assert "of a run with other settings (algorithm.adv_estimator: 'grpo' -> 'egpo')" in line
    assert (out / "run.log").stat().st_size == size


def test_the_checkpoint_merges_into_a_model_that_loads_and_generates(caption_run, tmp_path):
    """verl's model merger turns the smoke's checkpoint into a Hugging Face model: the trained
    weights (not the base model's), which load and caption an image."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from entropyrl.verl.cpu.backend import load_image_only_processor

    out, _, _ = caption_run
    actor = out / "checkpoints" / "global_step_3" / "actor"
    merged = tmp_path / "merged"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(actor),
            "--target_dir",
            str(merged),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    config = OmegaConf.load(out / "config.yaml")
    base = Path(config.actor_rollout_ref.model.path)
    model = AutoModelForImageTextToText.from_pretrained(merged, dtype=torch.float32)
    original = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    trained, start = model.state_dict(), original.state_dict()
    assert trained.keys() == start.keys()
    assert any(not torch.equal(trained[k], start[k]) for k in trained)  # RL moved the weights
    processor = load_image_only_processor(str(actor / "huggingface"))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    image = next((base.parent / "world").rglob("*.png"))
    inputs = processor(text=[prompt], images=[Image.open(image)], return_tensors="pt")
    generated = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > inputs["input_ids"].shape[1]


# -- LoRA (LORA_RANK) --------------------------------------------------------------------------

LORA_ENV = {"LORA_RANK": "8"}
# What LORA_RANK=8 adds for the captioning recipe (examples/common.sh: er_lora_overrides).
LORA_CAPTION = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.model.exclude_modules='.*visual.*'",
)


@pytest.fixture(scope="module")
def lora_caption_run(repo_root, smoke_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("chair_mscoco_lora_smoke")
    result = run_smoke(repo_root, "chair_mscoco.sh", out, smoke_cache, env=LORA_ENV)
    assert result.returncode == 0, tail(result)
    return out, result


def safetensors_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    return state


def test_lora_caption_smoke_trains_only_the_adapters(lora_caption_run, tmp_path):
    """LORA_RANK=8: the recipe with verl's LoRA (vision tower excluded) trains 2 steps through
    the hf rollout's adapter sync (the rollout's probabilities still the actor's), bounds from
    the schedule; the checkpoint holds the base unchanged and trained adapters on the language
    model only; merged, it loads and captions an image."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from entropyrl.commands.merge_lora import merge_lora
    from entropyrl.verl.cpu.backend import load_image_only_processor

    out, result = lora_caption_run
    assert "smoke check passed" in result.stdout
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "caption", LORA_CAPTION)
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.exclude_modules) == (8, 16, ".*visual.*")
    spec = config.algorithm.clip_schedule
    rows = [row for row in read_metrics(out / "metrics.jsonl") if row["step"] >= 1]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        data = row["data"]
        assert data["training/rollout_probs_diff_mean"] < 0.02  # adapters reached the rollout
        low, high = sorted((spec.low, spec.high))
        assert low - 1e-6 <= data["clip/bound_min"] <= data["clip/bound_max"] <= high + 1e-6
        assert data["actor/lr"] == pytest.approx(1e-5)
    target = tmp_path / "hf"
    actor = out / "checkpoints" / "global_step_2" / "actor"
    merge = ["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)]
    merger = subprocess.run(
        [sys.executable, "-m", "verl.model_merger", *merge],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert merger.returncode == 0, merger.stderr[-2000:]
    base_path = Path(config.actor_rollout_ref.model.path)
    initial, saved = safetensors_of(base_path), safetensors_of(target)
    assert saved.keys() == initial.keys()
    for name, value in saved.items():  # the base weights did not move (bf16 in the checkpoint)
        assert torch.equal(value, initial[name].to(value.dtype)), name
    adapter = safetensors_of(target / "lora_adapter")
    assert adapter and all(".language_model." in name for name in adapter)  # no vision tower
    assert all(v.abs().max() > 0 for n, v in adapter.items() if "lora_B" in n)  # trained
    # docs/lora.md: the whole module in fp32 and Adam's moments of the adapters, 4P + 12L bytes
    base_count = sum(v.numel() for v in initial.values())
    adapter_count = sum(v.numel() for v in adapter.values())
    written = sum(path.stat().st_size for path in actor.glob("*_world_size_1_rank_0.pt"))
    assert 1.0 <= written / (4 * base_count + 12 * adapter_count) <= 1.06
    merged = merge_lora(target)
    trained = safetensors_of(merged)
    moved = {name for name in trained if not torch.equal(trained[name], saved[name])}
    assert moved and all("visual" not in name for name in moved)
    policy = AutoModelForImageTextToText.from_pretrained(merged, dtype=torch.float32)
    processor = load_image_only_processor(str(actor / "huggingface"))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    image = next((base_path.parent / "world").rglob("*.png"))
    inputs = processor(text=[prompt], images=[Image.open(image)], return_tensors="pt")
    generated = policy.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > inputs["input_ids"].shape[1]


# -- the text recipes --------------------------------------------------------------------------


def test_fc_smoke_runs_the_recipe_with_its_dynamic_batches(fc_run):
    out, result = fc_run
    assert "smoke check passed" in result.stdout
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "function-calling")
    assert config.actor_rollout_ref.actor.use_dynamic_bsz
    assert config.actor_rollout_ref.model.use_remove_padding
    assert config.algorithm.adv_estimator == "egpo"
    every = read_metrics(out / "metrics.jsonl")
    assert every[0]["step"] == 0  # the recipe validates before training (val_before_train)
    rows = [row for row in every if row["step"] >= 1]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["data"]["egpo/entropy/missing"] == 0
        assert row["data"]["training/rollout_probs_diff_mean"] < 0.02
    assert any(k.startswith("val-core/") for k in every[0]["data"])
    assert any(k.startswith("val-core/") for k in rows[-1]["data"])
    driver = trace.read(out / "trace", "driver")
    assert all(row["clip_high"] is None for row in driver)  # no CHAIR schedule here
    model = json.loads((Path(config.actor_rollout_ref.model.path) / "config.json").read_text())
    assert model["model_type"] == "qwen3"


def test_mixed_smoke_scores_math_and_code_through_the_hybrid_reward(mixed_run):
    out, result = mixed_run
    assert "smoke check passed" in result.stdout
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "mixed")
    rows = [row for row in read_metrics(out / "metrics.jsonl") if row["step"] >= 1]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        data = row["data"]
        assert data["egpo/entropy/missing"] == 0
        # the ratio weights stay inside the recipe's [lambda_min, lambda_max]
        assert 0.5 - 1e-6 <= data["egpo/weight/mean"] <= 2.0 + 1e-6
    assert config.algorithm.adv_estimator == "egpo_ratio"
    assert config.algorithm.entropy.mode == "answer"
    assert config.reward.custom_reward_function.path.endswith("entropyrl.rewards.hybrid")
    # Hydra's own output folder stays inside the run folder
    assert (out / "hydra" / ".hydra" / "config.yaml").is_file()


# -- before a release (ENTROPYRL_FULL_SMOKE=1) -------------------------------------------------


def test_entropy_adv_through_real_verl(repo_root, smoke_cache, tmp_path):
    full_smoke()
    out = tmp_path / "entropy_adv"
    result = run_smoke(
        repo_root, "chair_mscoco.sh", out, smoke_cache, "algorithm.adv_estimator=entropy_adv"
    )
    assert result.returncode == 0, tail(result)
    assert all(
        row["data"]["egpo/entropy/missing"] == 0 for row in read_metrics(out / "metrics.jsonl")
    )


def test_grpo_function_calling_smoke(repo_root, smoke_cache, tmp_path):
    full_smoke()
    result = run_smoke(repo_root, "grpo_function_calling.sh", tmp_path / "grpo_fc", smoke_cache)
    assert result.returncode == 0, tail(result)


def test_the_fallbacks_in_a_real_run(repo_root, smoke_cache, tmp_path):
    """No entropy (rollout-correction bypass: verl computes none) -> the entropy estimator gives
    plain GRPO advantages and counts every sample missing; the CHAIR service never comes up
    (CHAIR_OPTIONAL=1) -> every sample gets the neutral bound and counts as a fallback. The
    run's own check recomputes both from the trace."""
    full_smoke()
    out, empty = tmp_path / "fallbacks", tmp_path / "empty-coco"
    empty.mkdir()
    result = run_smoke(
        repo_root,
        "chair_mscoco.sh",
        out,
        smoke_cache,
        "algorithm.adv_estimator=egpo",
        "algorithm.rollout_correction.bypass_mode=true",
        env={"CHAIR_OPTIONAL": "1", "CHAIR_COCO": str(empty), "CHAIR_TIMEOUT": "30"},
    )
    assert result.returncode == 0, tail(result)
    settings = smoke.default_settings("caption")
    samples = settings.prompts_per_step * settings.rollouts_per_prompt
    for row in read_metrics(out / "metrics.jsonl"):
        assert row["data"]["egpo/entropy/missing"] == samples
        assert row["data"]["chair/fallback_samples"] == samples
        assert row["data"]["clip/bound_min"] == row["data"]["clip/bound_max"] == pytest.approx(0.3)


# -- bad setups get one line, not a traceback -----------------------------------------------------


def test_lora_function_calling_smoke(repo_root, smoke_cache, tmp_path):
    """LORA_RANK=8 on the EGPO function-calling recipe: adapters on every linear layer."""
    full_smoke()
    out = tmp_path / "fc_lora"
    result = run_smoke(repo_root, "egpo_function_calling.sh", out, smoke_cache, env=LORA_ENV)
    assert result.returncode == 0, tail(result)
    assert "smoke check passed" in result.stdout
    config = OmegaConf.load(out / "config.yaml")
    assert config.actor_rollout_ref.model.lora_rank == 8
    assert config.actor_rollout_ref.model.exclude_modules is None
    rows = [row for row in read_metrics(out / "metrics.jsonl") if row["step"] >= 1]
    assert all(row["data"]["training/rollout_probs_diff_mean"] < 0.02 for row in rows)


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
    # a node without vLLM and flash-attn, which the script checks first
    overrides = [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    ]
    result = subprocess.run(
        ["bash", str(repo_root / "examples" / "chair_mscoco.sh"), *overrides],
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


# -- the hallucination evaluation of the caption smoke's checkpoint ------------------------------


def test_eval_smoke_merges_the_checkpoint_and_evaluates_it_beside_its_base(
    repo_root, caption_run, tmp_path
):
    """`bash examples/eval_chair_mscoco.sh --smoke`: verl's merger turns the caption smoke's
    checkpoint into a model, which captions and answers POPE beside the base model on the
    world's held-out images; every figure equals a recomputation from the written files."""
    import importlib.util

    run, _, _ = caption_run
    out = tmp_path / "eval"
    result = subprocess.run(
        [
            "bash",
            str(repo_root / "examples" / "eval_chair_mscoco.sh"),
            "--smoke",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SMOKE_RUN": str(run), "CHAIR_CACHE_DIR": str(tmp_path / "cache")},
        cwd=repo_root,
        timeout=SMOKE_TIMEOUT,
    )
    assert result.returncode == 0, tail(result)
    for name in ("results.json", "table.md", "figure.png"):
        assert (out / name).is_file()
    for model in ("base", "entropyrl"):
        assert (out / model / "captions.jsonl").stat().st_size > 0
        assert (out / model / "pope.jsonl").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    merged = results["models"]["entropyrl"]
    assert merged["kind"] == "checkpoint" and merged["checkpoint"].endswith("global_step_3/actor")
    assert (Path(merged["path"]) / "preprocessor_config.json").is_file() or (
        Path(merged["path"]) / "processor_config.json"
    ).is_file()
    assert results["results"]["chair@512"]["images"] == 20  # the held-out test split
    spec = importlib.util.spec_from_file_location(
        "eval_caption_checks", repo_root / "tests" / "evaluation" / "test_eval_caption.py"
    )
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    assets = Path(OmegaConf.load(run / "config.yaml").actor_rollout_ref.model.path).parent
    checks.check_recomputation(out, assets / "world")
