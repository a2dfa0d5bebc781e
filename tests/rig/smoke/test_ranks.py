"""Two data-parallel ranks on CPU: the real verl trainer gives the numbers of one rank, and every
sample keeps its own clip bound and advantage through balance_batch and the split over ranks.

Two real `main_ppo` runs through `examples/chair_mscoco.sh --smoke` (the recipe's tiny
Qwen2.5-VL), the same fixed batch through 1 and 2 ranks:

- `two_ranks` is the 2-rank smoke as a user runs it (`--ranks 2`: FSDP2 over gloo, one hf
  rollout replica per rank, balance_batch) with the batch settings below; `one_rank` the same
  on one rank. The 1-rank run records its rollouts (`ENTROPYRL_ROLLOUT_RECORD`) and the 2-rank
  run replays them (`ENTROPYRL_ROLLOUT_REPLAY`), so both train on the same prompts and
  responses; sampling itself cannot be shared, as each replica has its own seed and requests
  land on replicas by load.
- Both train with `maxent_grpo` (its advantages need the reference worker's log-probs, so a
  reference that did not reach the estimator fails the run) and use one PPO mini-batch per step
  and two PPO epochs: an update then sees the same rows in either layout (with several
  mini-batches, balance_batch groups different rows into a mini-batch on 2 ranks than on 1),
  and the second epoch is off-policy, so the per-sample clip acts (lr 1e-3 makes it act on this
  tiny model). The actor and reference run in float32 (`fsdp_config.mixed_precision`): in
  bfloat16 a changed reduction order moves a log-prob by a bfloat16 step (~0.4%), which flips
  single clip decisions and would hide the differences these tests look for.

The pair keeps the recipe's model: with the tiny Qwen3-VL the two layouts already differ before
the update (log-probs and entropies by up to 1.5e-5 relative, observed), which would hide what
this comparison looks for; Qwen3-VL trains in the LoRA captioning smoke (tests/conftest.py).
Several mini-batches per step are the 1-rank smokes' default (tests/rig/smoke/test_smoke.py); every
smoke's own check matches each row that reached the loss to the driver's sample, whatever
mini-batch, rank and position it got (`entropyrl.rig.smoke.check.check_loss_inputs`).

Tolerances (float32, as observed on this batch, with margin): before the first update both
layouts compute each sample's old log-probs, entropies, advantages and bound from the same
parameters with the same per-row arithmetic (`SAME_PARAMETERS`, observed: bit-equal). The update
sums gradients in another order: one process accumulates its micro-batches, two ranks add their
float32 shares in gloo's reduce-scatter, so the update's loss and gradient norm agree to
float32 rounding (`UPDATE`: relative 1e-3; observed 3e-5 for the gradient norm, 4e-7 for the
loss) and so do the updated policy's log-probs and entropies (`AFTER_UPDATE`: 1e-5; observed
2e-6). Driver metrics average the same per-sample values in another batch order
(`BATCH_MEAN`: relative 1e-6). Clip fractions are counts of tokens over the mini-batch's tokens:
equal up to the rounding of the sum (1e-9); one flipped clip decision would move them by
1/tokens, about 2e-3. The rollout is seeded per request (`rollout.full_determinism`), so the
batch, and whether any ratio sits within rounding of a clip bound, is the same in every run.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from entropyrl.core.clip_schedules import clip_high_bounds
from entropyrl.core.specs import ClipScheduleSpec
from entropyrl.rig import trace
from entropyrl.rig.cpu.hf_rollout import RECORD_ENV, REPLAY_ENV
from entropyrl.rig.smoke import settings as smoke_settings
from entropyrl.rig.smoke.check import read_metrics
from entropyrl.rig.smoke.step_metrics import CLIP_FRACTIONS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.xdist_group("ranks"),
]  # the pair, made in one worker
RUN_TIMEOUT = 1800
SETTINGS = smoke_settings.default_settings("caption", ranks=2)
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
PAIR_PROMPTS = 4  # prompts per step of the 1-vs-2 pair: one mini-batch, 20 rows
SAME_BATCH = (
    "actor_rollout_ref.rollout.full_determinism=true",
    f"data.train_batch_size={PAIR_PROMPTS}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={PAIR_PROMPTS}",
    # MaxEnt-GRPO reads the reference worker's log-probs: beta > 0 fails without them
    "algorithm.adv_estimator=maxent_grpo",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={FP32}",
    f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={FP32}",
)
SAME_PARAMETERS = {"rel": 0.0, "abs": 1e-6}
UPDATE = {"rel": 1e-3, "abs": 1e-7}
AFTER_UPDATE = {"rel": 1e-4, "abs": 1e-5}
BATCH_MEAN = {"rel": 1e-6, "abs": 1e-7}
COUNTS = {"rel": 0.0, "abs": 1e-9}


# -- the runs ---------------------------------------------------------------------------------


def run_caption_smoke(repo_root: Path, out: Path, cache: Path, *args: str, env=None):
    full_env = dict(os.environ)
    full_env.update(
        ENTROPYRL_SMOKE_CACHE=str(cache),
        ENTROPYRL_TRACE_DIR=str(out / "trace"),
        CHAIR_CACHE_DIR=str(out / "chair-cache"),
    )
    full_env.update(env or {})
    result = subprocess.run(
        [
            "bash",
            str(repo_root / "examples" / "chair_mscoco.sh"),
            "--smoke",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=repo_root,
        timeout=RUN_TIMEOUT,
    )
    text = (result.stdout or "") + (result.stderr or "")
    assert result.returncode == 0, "\n".join(text.splitlines()[-60:])
    assert "smoke check passed" in result.stdout
    return out


@pytest.fixture(scope="module")
def one_rank(repo_root, smoke_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_rank")
    env = {RECORD_ENV: str(out / "rollouts.jsonl")}
    return run_caption_smoke(repo_root, out, smoke_cache, "--ranks", "1", *SAME_BATCH, env=env)


def this_machines_address() -> str:
    """The first non-loopback address `hostname -I` lists (what the launch script uses)."""
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    addresses = [a for a in addresses if not a.startswith("127.") and ":" not in a]
    assert addresses, "this machine has no non-loopback IPv4 address for the CHAIR service"
    return addresses[0]


CHAIR_TOKEN = "two-ranks-token"


@pytest.fixture(scope="module")
def two_ranks(repo_root, smoke_cache, tmp_path_factory, one_rank) -> Path:
    # The CHAIR service as a multi-node run has it: on an address other machines reach, with
    # the token required, which the reward workers read from the same variable.
    out = tmp_path_factory.mktemp("two_ranks")
    env = {
        REPLAY_ENV: str(one_rank / "rollouts.jsonl"),
        "CHAIR_HOST": this_machines_address(),
        "CHAIR_SERVER_TOKEN": CHAIR_TOKEN,
    }
    return run_caption_smoke(repo_root, out, smoke_cache, "--ranks", "2", *SAME_BATCH, env=env)


# -- reading a run ----------------------------------------------------------------------------


def metrics(out: Path) -> dict[int, dict[str, float]]:
    """The training steps' metrics; step 0 is the validation before training (checked)."""
    rows = {row["step"]: row["data"] for row in read_metrics(out / "metrics.jsonl")}
    assert "val-core/coco_caption/reward/mean@1" in rows.pop(0)
    return rows


def driver_rows(out: Path) -> dict[tuple[int, str], dict]:
    """The driver's rows by (step, sample key); a key seen twice is the same response to the
    same prompt, and then its values agree (checked)."""
    rows: dict[tuple[int, str], dict] = {}
    for row in trace.read(out / "trace", "driver"):
        if row["padding"]:
            continue
        key = (row["step"], row["key"])
        if key in rows:
            for name in ("clip_high", "advantages", "old_log_probs", "entropy", "chair_i"):
                assert row[name] == rows[key][name], (key, name)
        rows.setdefault(key, row)
    return rows


def worker_rows(out: Path) -> list[dict]:
    rows = trace.read(out / "trace", "worker")
    assert rows, "the actor loss wrote no trace"
    return rows


def assert_close_lists(a, b, tolerance: dict, what: str) -> None:
    assert a is not None and b is not None and len(a) == len(b), what
    for x, y in zip(a, b):
        assert y == pytest.approx(x, **tolerance), what


# -- 1. the two-rank smoke --------------------------------------------------------------------


def test_two_rank_smoke_trains_on_two_fsdp_ranks(two_ranks):
    import json

    from omegaconf import OmegaConf

    out = two_ranks
    config = OmegaConf.load(out / "config.yaml")
    model = Path(config.actor_rollout_ref.model.path) / "config.json"
    assert json.loads(model.read_text())["model_type"] == "qwen2_5_vl"
    assert config.trainer.n_gpus_per_node == 2 and config.trainer.nnodes == 1
    assert config.trainer.balance_batch is True
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1  # a replica per rank
    steps = metrics(out)
    assert sorted(steps) == [1, 2]
    for data in steps.values():  # the caption recipe's metrics, reduced over both ranks
        assert {"actor/pg_loss", "clip/bound_mean", "chair/chair_i_mean"} <= set(data)
    workers = worker_rows(out)
    assert {row["rank"] for row in workers} == {0, 1}
    assert {row["dp_size"] for row in workers} == {2}
    assert {row["threads"] for row in workers} == {1}  # 2 ranks on 2 cores: one thread each
    for rank in (0, 1):
        for step in (1, 2):
            calls = {r["call"] for r in workers if r["rank"] == rank and r["step"] == step}
            assert len(calls) >= 2  # a loss call per PPO epoch (one micro-batch each)


# -- 2. the same numbers as one rank ----------------------------------------------------------


def test_two_ranks_scored_through_a_service_on_a_reachable_address_with_the_token(two_ranks):
    from omegaconf import OmegaConf

    config = OmegaConf.load(two_ranks / "config.yaml")
    url = config.reward.custom_reward_function.reward_kwargs.chair_url
    assert url.startswith(f"http://{this_machines_address()}:")
    assert CHAIR_TOKEN not in (two_ranks / "config.yaml").read_text()
    for step, data in metrics(two_ranks).items():
        assert data["chair/fallback_samples"] == 0, step
        assert data["chair/scored_samples"] == PAIR_PROMPTS * SETTINGS.rollouts_per_prompt


def test_two_ranks_compute_the_numbers_of_one_rank(one_rank, two_ranks):
    one, two = driver_rows(one_rank), driver_rows(two_ranks)
    assert set(one) == set(two)  # the same samples (replayed)
    assert {step for step, _ in one} == {1, 2}
    for (step, key), a in one.items():
        b = two[(step, key)]
        assert b["chair_i"] == a["chair_i"] and b["clip_high"] == a["clip_high"], (step, key)
        # Step 1 is computed before any update; step 2 by the policy the first step trained.
        tolerance = SAME_PARAMETERS if step == 1 else AFTER_UPDATE
        for name in ("old_log_probs", "entropy", "advantages"):
            assert_close_lists(a[name], b[name], tolerance, f"step {step} {key} {name}")
    # What each layout's loss used for a sample: its bound and advantages, in every epoch.
    for out in (one_rank, two_ranks):
        used = defaultdict(list)
        for row in worker_rows(out):
            used[(row["step"], row["key"])].append(row)
        assert set(used) == set(one)  # every sample reached the loss
        for (step, key), rows in used.items():
            expected = one[(step, key)]
            assert {row["clip_high"] for row in rows} == {expected["clip_high"]}, (step, key)
            for row in rows:
                assert_close_lists(expected["advantages"], row["advantages"], AFTER_UPDATE, key)
    # The first step's update: policy loss and gradient norm (each the mean over its two epochs).
    m1, m2 = metrics(one_rank), metrics(two_ranks)
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert m2[1][name] == pytest.approx(m1[1][name], **UPDATE), name


# -- 3. bounds follow their samples -----------------------------------------------------------


def test_bounds_follow_their_samples_through_balance_batch(two_ranks):
    from omegaconf import OmegaConf

    out = two_ranks
    driver = driver_rows(out)
    steps = metrics(out)
    schedule = ClipScheduleSpec.from_mapping(
        OmegaConf.load(out / "config.yaml").algorithm.clip_schedule
    )
    order = defaultdict(list)  # the driver's (balanced) batch order, per step
    for row in trace.read(out / "trace", "driver"):
        order[row["step"]].append(row)
    workers = worker_rows(out)
    for step, rows in order.items():
        rows.sort(key=lambda r: r["position"])
        lengths = [r["seq_len"] for r in rows]
        assert len(set(lengths)) > 1  # mixed lengths
        data = steps[step]
        # balance_batch never leaves the ranks less balanced than the contiguous split verl
        # would otherwise dispatch (verl's own global_seqlen metrics). Whether it is strictly
        # better depends on the sampled lengths, which another CPU's float rounding changes
        # (a fresh CI machine drew a batch whose contiguous split was already optimal), so what
        # is asserted of every step is that it moved the rows: the rollout hands each prompt's
        # responses over side by side, and balance_batch's order (verl sorts each rank's share
        # by workload) scatters them.
        balanced = data["global_seqlen/balanced_max"] - data["global_seqlen/balanced_min"]
        assert data["global_seqlen/minmax_diff"] >= balanced
        groups = [r["group"] for r in rows]
        adjacent_runs = 1 + sum(a != b for a, b in itertools.pairwise(groups))
        assert adjacent_runs > len(set(groups)), (step, "balance_batch kept the rollout's order")
        half = len(rows) // 2
        for rank, chunk in enumerate((rows[:half], rows[half:])):
            # rank r trains on the r-th half of the balanced order: its sequence-length sum is
            # one of the balanced partition's
            seen = {r["key"] for r in workers if r["rank"] == rank and r["step"] == step}
            assert seen == {r["key"] for r in chunk}, (step, rank)
            assert sum(r["seq_len"] for r in chunk) in (
                data["global_seqlen/balanced_min"],
                data["global_seqlen/balanced_max"],
            )
    for row in workers:  # every micro-batch row: the driver's bound and advantages for its key
        expected = driver[(row["step"], row["key"])]
        assert row["clip_high"] == expected["clip_high"], row["key"]
        assert row["advantages"] == expected["advantages"], row["key"]
        assert row["old_log_probs"] == expected["old_log_probs"], row["key"]
    chair = torch.tensor(
        [math.nan if r["chair_i"] is None else r["chair_i"] for r in driver.values()]
    )
    bounds = clip_high_bounds(chair, schedule)
    # the driver's bound is the schedule's for the sample's own CHAIR_i
    assert [r["clip_high"] for r in driver.values()] == pytest.approx(bounds.tolist(), abs=1e-6)
    assert {round(b, 6) for b in bounds.tolist()} == {schedule.low, schedule.high}


# -- 4. metrics across ranks ------------------------------------------------------------------


def test_two_rank_step_metrics_equal_the_one_rank_step(one_rank, two_ranks):
    m1, m2 = metrics(one_rank), metrics(two_ranks)
    assert sorted(m1) == sorted(m2) == [1, 2]
    # Unequal shares: the loss calls (micro-batches) of the 2-rank run hold different numbers of
    # response tokens, so a mean of their means would not be the mini-batch's fraction.
    shares = defaultdict(int)
    for row in worker_rows(two_ranks):
        shares[(row["step"], row["rank"], row["call"])] += len(row["advantages"])
    assert len(set(shares.values())) > 1
    for step in (1, 2):
        a, b = m1[step], m2[step]
        assert a["actor/clip/frac_high"] > 0 and a["actor/clip/frac_low"] > 0  # the clip acts
        for name in CLIP_FRACTIONS:
            assert b[name] == pytest.approx(a[name], **COUNTS), (step, name)
        assert b["actor/clip/high_mean"] == pytest.approx(a["actor/clip/high_mean"], **BATCH_MEAN)
        assert b["actor/ppo_kl"] == pytest.approx(a["actor/ppo_kl"], **AFTER_UPDATE)
        # The driver's own metrics (CHAIR, MaxEnt, the bounds it gave): the same samples,
        # averaged in another order; at step 2 the entropies come from the updated policy.
        driver = [n for n in a if n.startswith(("chair/", "egpo/", "maxent/", "clip/"))]
        assert {"chair/chair_i_mean", "maxent/target_entropy", "clip/bound_mean"} <= set(driver)
        for name in driver:
            tolerance = BATCH_MEAN if step == 1 or name.startswith("chair/") else AFTER_UPDATE
            assert b[name] == pytest.approx(a[name], **tolerance), (step, name)
