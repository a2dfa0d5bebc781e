"""The launch scripts' `--smoke`: the recipe itself through the real verl trainer (Ray,
TransferQueue, FSDP2, the `hf` rollout, the reward loop, the CHAIR service over HTTP) on this
machine's CPU.

These are the end-to-end evidence for the verl path; each run is made once per test session
(`smoke_runs` / `caption_run` in tests/conftest.py) and read by every test that needs it:
- the caption recipe (grpo, per-sample clip, remove-padding, gradient checkpointing, validation,
  checkpoints), killed with SIGKILL after its step-2 checkpoint and started again with the same
  command: it resumes and finishes step 3; the same folder then refuses another estimator and
  says a finished run has nothing left to do; its checkpoint merges into a Hugging Face model;
- the function-calling recipe (egpo, dynamic batch sizes) and the mixed recipe (egpo_ratio) with
  LoRA on the text model;
- LoRA on the caption recipe with the tiny Qwen3-VL and `entropy_adv` (token-level shaping
  through real verl), and a run that shows the fall-backs (no entropy: plain GRPO; CHAIR service
  down: the neutral bound);
- in tests/rig/smoke/test_ranks.py: two ranks against one (`maxent_grpo`, the reference's log-probs).
Every run's own check (`entropyrl.rig.smoke.check`) recomputes every step's advantages,
rewards and bounds from the trace, matches what reached the loss to its sample and proves the
weight sync; tests/rig/smoke/test_smoke_check.py
feeds it these runs with planted faults. Each run's config differs from the recipe's only in the
allowed keys.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.rig import trace
from entropyrl.rig.smoke import settings as smoke_settings
from entropyrl.rig.smoke.check import clip_rule, is_training_row, read_metrics

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
CAPTION = pytest.mark.xdist_group("caption")


def load_smoke_config_module():
    import importlib.util

    path = Path(__file__).with_name("test_smoke_config.py")
    spec = importlib.util.spec_from_file_location("smoke_config_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_rows(out: Path) -> list[dict]:
    return [row for row in read_metrics(out / "metrics.jsonl") if is_training_row(row)]


def probe_rows(out: Path) -> tuple[list[dict], list[dict]]:
    return trace.read(out / "trace", "sync"), trace.read(out / "trace", "rollout")


def assert_the_sync_was_judged(out: Path, kind: str) -> None:
    """The weight-sync probe compared weights that changed: the actor sent at least two
    different versions of the trained tensors, and the rollout generated with each."""
    syncs, rollouts = probe_rows(out)
    sent = [row for row in syncs if row["kind"] == kind]
    versions = {json.dumps(row["tensors"], sort_keys=True) for row in sent}
    assert len(versions) >= 2, f"the {kind} tensors never changed between syncs"
    used = {row["state"] for row in rollouts}
    assert len(used) >= 2, "the rollout generated with one set of weights only"


def caption_mentions(text: str, world: Path) -> list[str]:
    """The COCO objects a caption mentions (the CHAIR service's own parser, in process)."""
    from chair_server.scorer import ChairScorer

    scorer = ChairScorer.from_coco(world, use_cache=False)
    return [word for word, _ in scorer.mentions(text)]


# -- the caption recipe: resumed after a kill ---------------------------------------------------


@CAPTION
def test_a_killed_caption_smoke_resumes_where_it_stopped(caption_run):
    out = caption_run.out
    killed_rows = read_metrics(out / "killed_metrics.jsonl")
    # the killed run's steps, after its validation before training (step 0)
    assert [row["step"] for row in killed_rows][:3] == [0, 1, 2]
    assert "resuming the run in" in caption_run.stderr
    assert "after step 2" in caption_run.stderr
    assert "smoke check passed: 3 steps" in caption_run.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for before, after in zip(killed_rows[1:3], rows[1:3]):  # kept, not trained again
        assert before["data"]["critic/score/mean"] == after["data"]["critic/score/mean"]
    # the resumed run validated again before going on: its row joins step 2's
    assert "val-core/coco_caption/reward/mean@1" in rows[2]["data"]
    runs = {row["step"]: row["run"] for row in trace.read(out / "trace", "driver")}
    assert runs[1] == runs[2] != runs[3]  # step 3 by the second run only
    # the terminal shows one line per step and the verdict, not verl's console
    assert "target_num_threads" not in caption_run.stdout + caption_run.stderr
    assert "step 3  reward=" in caption_run.stdout
    assert (out / "run.log").stat().st_size > 0


@CAPTION
def test_caption_smoke_runs_the_recipe(caption_run):
    config = OmegaConf.load(caption_run.out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "caption")
    model = config.actor_rollout_ref.model
    assert model.use_remove_padding and model.enable_gradient_checkpointing
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_sample_clip"
    assert json.loads((Path(model.path) / "config.json").read_text())["model_type"] == "qwen2_5_vl"


@CAPTION
def test_caption_smoke_validates_and_checkpoints(caption_run):
    out = caption_run.out
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
    assert rows[0]["step"] == 0 and not is_training_row(rows[0])  # validation before training
    assert math.isfinite(rows[0]["data"]["val-aux/coco_caption/chair_i/mean@1"])
    for row in rows[1:]:
        assert row["data"]["chair/fallback_samples"] == 0
        assert row["data"]["chair/scored_samples"] == 20  # 4 prompts x 5
    assert_the_sync_was_judged(out, "weights")


@CAPTION
def test_bounds_that_reached_the_loss_are_the_drivers(caption_run):
    """Per sample, in the real run: loss-side bound and advantages == the driver's, every real
    sample of each step reached the loss, and each bound is the rule's for its CHAIR_i, with
    both bounds taken."""
    out = caption_run.out
    config = OmegaConf.load(out / "config.yaml")
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
    spec = config.algorithm.clip_schedule
    for row in driver.values():
        assert row["clip_high"] == pytest.approx(clip_rule(row["chair_i"], spec), abs=1e-6)
    assert {round(row["clip_high"], 6) for row in driver.values()} == {spec.low, spec.high}


@CAPTION
def test_a_finished_run_says_so_and_another_estimator_is_refused(
    caption_run, smoke_cache, smoke_helpers
):
    out = caption_run.out
    env = smoke_helpers.env(smoke_cache, out)
    size = (out / "run.log").stat().st_size
    command = smoke_helpers.command
    again = subprocess.run(
        command("chair_mscoco.sh", out, *smoke_helpers.RESUMED_STEPS),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "nothing left to do" in again.stderr
    assert (out / "run.log").stat().st_size == size  # nothing started
    other = subprocess.run(
        command(
            "chair_mscoco.sh", out, *smoke_helpers.RESUMED_STEPS, "algorithm.adv_estimator=egpo"
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


def generate_caption(model_path: Path, processor_path: Path, image: Path) -> str:
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from entropyrl.rig.cpu.backend import load_image_only_processor

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32)
    processor = load_image_only_processor(str(processor_path))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    inputs = processor(text=[prompt], images=[Image.open(image)], return_tensors="pt")
    generated = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    new = generated[0, inputs["input_ids"].shape[1] :]
    return processor.tokenizer.decode(new, skip_special_tokens=True)


def merge(actor: Path, target: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"),
            *("--local_dir", str(actor), "--target_dir", str(target)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]


@CAPTION
def test_the_checkpoint_merges_into_the_trained_model_that_captions(caption_run, tmp_path):
    """verl's model merger turns the smoke's checkpoint into a Hugging Face model holding the
    checkpoint's own weights (not the base model's), which captions an image: its greedy caption
    names at least one COCO object of the world."""
    from safetensors.torch import load_file

    out = caption_run.out
    actor = out / "checkpoints" / "global_step_3" / "actor"
    merged = tmp_path / "merged"
    merge(actor, merged)
    config = OmegaConf.load(out / "config.yaml")
    base = Path(config.actor_rollout_ref.model.path)
    saved = {}
    for path in sorted(merged.glob("*.safetensors")):
        saved.update(load_file(path))
    start = {}
    for path in sorted(base.glob("*.safetensors")):
        start.update(load_file(path))
    assert saved.keys() == start.keys()
    assert any(not torch.equal(saved[k].float(), start[k].float()) for k in saved)  # RL moved them
    # the dry-run's disk figure (entropyrl.verl.checks.budget): the fp32 model and Adam's moments,
    # 12 bytes a parameter, against what verl wrote (observed 1.01x: pickling and the step)
    from entropyrl.verl.checks import budget

    written = sum(path.stat().st_size for path in actor.glob("*_world_size_1_rank_0.pt"))
    expected = budget.checkpoint_bytes(budget.parameter_count(base))
    assert 1.0 <= written / expected <= 1.06
    world = base.parent / "world"
    image = next(world.rglob("*.png"))
    caption = generate_caption(merged, actor / "huggingface", image)
    assert caption_mentions(caption, world), caption


# -- LoRA (LORA_RANK) with entropy_adv ----------------------------------------------------------


def safetensors_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    return state


@pytest.mark.xdist_group("lora_caption_entropy_adv")
def test_lora_caption_smoke_with_entropy_adv_trains_only_the_adapters(
    smoke_runs, smoke_helpers, tmp_path
):
    """LORA_RANK=8 on the caption recipe with the tiny Qwen3-VL (SMOKE_MODEL=qwen3_vl, the
    architecture users move to) and `entropy_adv` (token-level entropy shaping through real
    verl, every token's advantage checked by the run's own check): verl's LoRA (vision tower
    excluded) trains 2 steps; the weight-sync probe saw the adapters reach the rollout; bounds
    from the schedule; the checkpoint holds the base unchanged and trained adapters on the
    language model only; merged, it captions an image."""
    from entropyrl.commands.merge_lora import merge_lora

    run = smoke_runs("lora_caption_entropy_adv")
    out = run.out
    config = OmegaConf.load(out / "config.yaml")
    extra = (*smoke_helpers.LORA_CAPTION, "algorithm.adv_estimator=entropy_adv")
    load_smoke_config_module().assert_only_allowed_differences(config, "caption", extra)
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.exclude_modules) == (8, 16, ".*visual.*")
    assert json.loads((Path(model.path) / "config.json").read_text())["model_type"] == "qwen3_vl"
    assert config.algorithm.adv_estimator == "entropy_adv"
    rows = training_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["data"]["egpo/entropy/missing"] == 0
        assert row["data"]["actor/lr"] == pytest.approx(1e-5)
    # token-level shaping: within a response, advantages differ from token to token
    driver = [r for r in trace.read(out / "trace", "driver") if not r["padding"]]
    assert any(len(set(r["advantages"])) > 1 for r in driver)
    assert_the_sync_was_judged(out, "adapter")
    target = tmp_path / "hf"
    actor = out / "checkpoints" / "global_step_2" / "actor"
    merge(actor, target)
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
    world = base_path.parent / "world"
    image = next(world.rglob("*.png"))
    caption = generate_caption(merged, actor / "huggingface", image)
    assert caption_mentions(caption, world), caption


# -- the text recipes --------------------------------------------------------------------------


@pytest.mark.xdist_group("fc")
def test_fc_smoke_runs_the_recipe_with_its_dynamic_batches(smoke_runs):
    out = smoke_runs("fc").out
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(config, "function-calling")
    assert config.actor_rollout_ref.actor.use_dynamic_bsz
    assert config.actor_rollout_ref.model.use_remove_padding
    assert config.algorithm.adv_estimator == "egpo"
    every = read_metrics(out / "metrics.jsonl")
    assert every[0]["step"] == 0  # the recipe validates before training (val_before_train)
    rows = training_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["data"]["egpo/entropy/missing"] == 0
    assert any(k.startswith("val-core/") for k in every[0]["data"])
    assert any(k.startswith("val-core/") for k in rows[-1]["data"])
    driver = trace.read(out / "trace", "driver")
    assert all(row["clip_high"] is None for row in driver)  # no CHAIR schedule here
    model = json.loads((Path(config.actor_rollout_ref.model.path) / "config.json").read_text())
    assert model["model_type"] == "qwen3"
    assert_the_sync_was_judged(out, "weights")


@pytest.mark.xdist_group("mixed")
def test_mixed_smoke_with_lora_scores_math_and_code_through_the_hybrid_reward(
    smoke_runs, smoke_helpers
):
    """LORA_RANK=8 on the mixed recipe: EGPO's ratio calibration on math and code through the
    hybrid reward, LoRA adapters on every linear layer of the text model (Qwen3), the adapters
    seen to reach the rollout."""
    out = smoke_runs("mixed").out
    config = OmegaConf.load(out / "config.yaml")
    load_smoke_config_module().assert_only_allowed_differences(
        config, "mixed", smoke_helpers.LORA_TEXT
    )
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.exclude_modules) == (8, 16, None)
    assert json.loads((Path(model.path) / "config.json").read_text())["model_type"] == "qwen3"
    rows = training_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["data"]["egpo/entropy/missing"] == 0
        assert row["data"]["actor/lr"] == pytest.approx(1e-5)
    # the calibration acted: some sample's weight differed from 1 (the run's own check
    # recomputes each sample's weighted advantage)
    assert any(row["data"]["egpo/weight/std"] > 0 for row in rows)
    assert config.algorithm.adv_estimator == "egpo_ratio"
    assert config.algorithm.entropy.mode == "answer"
    assert config.reward.custom_reward_function.path.endswith("entropyrl.verl.rewards")
    assert config.reward.custom_reward_function.name == "hybrid_score"
    assert_the_sync_was_judged(out, "adapter")
    # Hydra's own output folder stays inside the run folder
    assert (out / "hydra" / ".hydra" / "config.yaml").is_file()


@pytest.mark.xdist_group("fallbacks")
def test_the_fallbacks_in_a_real_run(smoke_runs):
    """No entropy (rollout-correction bypass: verl computes none) -> the entropy estimator gives
    plain GRPO advantages and counts every sample missing; the CHAIR service never comes up
    (CHAIR_OPTIONAL=1) -> every sample gets the neutral bound and counts as a fallback. The
    run's own check recomputes both from the trace."""
    out = smoke_runs("fallbacks").out
    settings = smoke_settings.default_settings("caption")
    samples = settings.prompts_per_step * settings.rollouts_per_prompt
    rows = training_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        # verl pads a step that lost a sample back to whole mini-batches: the estimator's count
        # of rows without entropy takes the padding in, the CHAIR count only real rows
        lost = row["data"]["rollout/lost_samples"]
        assert row["data"]["egpo/entropy/missing"] == samples
        assert row["data"]["chair/fallback_samples"] == samples - lost
        assert row["data"]["clip/bound_min"] == row["data"]["clip/bound_max"] == pytest.approx(0.3)
    driver = [r for r in trace.read(out / "trace", "driver") if not r["padding"]]
    assert all(r["entropy"] is None and r["chair_i"] is None for r in driver)


@pytest.mark.xdist_group("fallbacks")
def test_a_reward_call_that_raises_is_counted_named_and_within_the_limit_trained_past(smoke_runs):
    """The first training reward call raises (a malformed ground truth, as a broken data row
    gives: tests/verl/planted/failing_reward.py); verl fails that session. The step counts the
    sample lost, names the cause the reward reported, and, 1 of 20 being within the run's limit
    (algorithm.lost_samples.max_fraction=0.1), trains on the 19 that arrived."""
    out = smoke_runs("fallbacks").out
    settings = smoke_settings.default_settings("caption")
    samples = settings.prompts_per_step * settings.rollouts_per_prompt
    counts = [
        {name: row["data"][name] for name in ("rollout/lost_samples", "rollout/reward_failures")}
        for row in training_rows(out)
    ]
    assert counts == [
        {"rollout/lost_samples": 1, "rollout/reward_failures": 1},
        {"rollout/lost_samples": 0, "rollout/reward_failures": 0},
    ]
    assert all(row["data"]["rollout/expected_samples"] == samples for row in training_rows(out))
    warning = (
        f"entropyrl: warning: step 1: 1 of {samples} samples lost, going on with the "
        f"{samples - 1} that arrived (algorithm.lost_samples.max_fraction=0.1 allows 2); reward "
        "calls failed: 1x ValueError: ground_truth is not JSON"
    )
    assert warning in (out / "run.log").read_text()
    driver = [r for r in trace.read(out / "trace", "driver") if not r["padding"]]
    assert len([r for r in driver if r["step"] == 1]) == samples - 1
    assert len([r for r in driver if r["step"] == 2]) == samples


# -- bad setups get one line, not a traceback -----------------------------------------------------


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def assert_one_line_error(run, needle: str) -> None:
    assert run.returncode == 2, run.tail()
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], run.stderr


def test_smoke_without_verl_says_so(smoke_script, tmp_path):
    python = write_executable(tmp_path / "python", '#!/bin/sh\nexec python3 -S "$@"\n')
    run = smoke_script("chair_mscoco.sh", tmp_path / "out", tmp_path, env={"PYTHON": str(python)})
    assert_one_line_error(run, "verl is not installed")


def test_smoke_with_another_verl_says_so(smoke_script, tmp_path):
    fake = tmp_path / "site" / "verl-0.8.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.8.0\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    run = smoke_script("chair_mscoco.sh", tmp_path / "out", tmp_path, env=env)
    assert_one_line_error(run, "verl 0.8.0 is installed")


def test_gpu_run_without_a_model_says_so(tmp_path):
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
        ["bash", str(REPO / "examples" / "chair_mscoco.sh"), *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-model" in errors[0], result.stderr


def test_cpu_run_without_smoke_points_to_it(tmp_path):
    env = dict(os.environ)
    env["PATH"] = ":".join(
        p for p in env["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists()
    )
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "chair_mscoco.sh")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nvidia-smi not found" in errors[0], result.stderr
    assert "--smoke" in result.stderr


# -- the hallucination evaluation of the caption smoke's checkpoint ------------------------------


@CAPTION
def test_eval_smoke_merges_the_checkpoint_and_evaluates_it_beside_its_base(caption_run, tmp_path):
    """`bash examples/eval_chair_mscoco.sh --smoke`: verl's merger turns the caption smoke's
    checkpoint into a model, which captions and answers POPE beside the base model on the
    world's held-out images; every figure equals a recomputation from the written files."""
    import importlib.util

    run = caption_run.out
    out = tmp_path / "eval"
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "eval_chair_mscoco.sh"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "SMOKE_RUN": str(run), "CHAIR_CACHE_DIR": str(tmp_path / "cache")},
        cwd=REPO,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
        "eval_caption_checks", REPO / "tests" / "evaluation" / "test_eval_caption.py"
    )
    checks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = checks  # its dataclasses look their module up by name
    spec.loader.exec_module(checks)
    assets = Path(OmegaConf.load(run / "config.yaml").actor_rollout_ref.model.path).parent
    checks.check_recomputation(out, assets / "world")
