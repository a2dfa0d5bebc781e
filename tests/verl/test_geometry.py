"""The batch-geometry check accepts exactly the configs verl 0.9.1's own batch code accepts.

For each config and layout the test runs verl's functions on one rank's share of a step, the
way the sync trainer and the FSDP workers call them:
- `verl.utils.config.validate_config` (verl's own, unwrapped), as `main_ppo` calls it;
- `PPOTrainer._get_required_batch_multiple` (the driver pads the step to its multiple) and
  `tensordict_utils.chunk_tensordict` (the step dealt to the data-parallel ranks);
- `TrainingWorker.infer_batch` -> `BaseEngine.infer_batch` -> `prepare_micro_batches` for the
  old-log-prob and reference passes;
- `TrainingWorker.train_mini_batch` -> `TrainingWorker.train_batch` -> `BaseEngine.train_batch`
  -> `prepare_micro_batches` for the actor update;
- `RolloutReplica.__init__` for the rollout replicas.
The engine underneath is a stand-in whose forward pass only cuts micro-batches (the two lines of
`FSDPEngine.forward_backward_batch` before the model runs), and the worker's engine settings are
copied from the config as `ActorRolloutRefWorker.init_model` copies them. Every sequence has the
longest length the config allows, so a token budget below it asserts as it would on the longest
batch. The recipes pass on every layout docs/scaling.md lists; random configs (hypothesis) are
accepted by `geometry_problems` exactly when verl raises nothing.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from tensordict import TensorDict

from entropyrl.verl.checks.geometry import batch_geometry, describe, divisors, geometry_problems

RECIPES = ("chair_mscoco", "egpo_function_calling", "grpo_function_calling", "egpo_ratio_mixed")
LAYOUTS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (8, 8))  # (nodes, GPUs per node)


@pytest.fixture(scope="module", autouse=True)
def process_group(tmp_path_factory):
    """train_mini_batch all-gathers token counts over the data-parallel group: one gloo rank."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sequences(rows: int, length: int) -> TensorDict:
    ids = torch.nested.as_nested_tensor(
        [torch.ones(length, dtype=torch.long) for _ in range(rows)], layout=torch.jagged
    )
    mask = torch.nested.as_nested_tensor(
        [torch.ones(length, dtype=torch.long) for _ in range(rows)], layout=torch.jagged
    )
    return TensorDict({"input_ids": ids, "loss_mask": mask}, batch_size=[rows])


class _Engine:
    """verl's BaseEngine with a forward pass that only cuts micro-batches."""

    train_batch = None  # set below to verl's own BaseEngine.train_batch / infer_batch
    infer_batch = None

    def __init__(self, dp: int, sp: int) -> None:
        self.dp, self.sp = dp, sp

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import prepare_micro_batches

        # FSDPEngine.forward_backward_batch, up to the model call
        tu.assign_non_tensor(data, sp_size=self.sp)
        prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
        return {"metrics": {}}

    def get_data_parallel_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_group(self):
        return None

    def train_mode(self, **_):
        return contextlib.nullcontext()

    eval_mode = train_mode

    def optimizer_zero_grad(self):
        pass

    def optimizer_step(self):
        return 0.0

    def lr_scheduler_step(self):
        return 0.0

    def is_mp_src_rank_with_outputs(self):
        return False


def _worker(dp: int, sp: int, *, dynamic: bool, micro, max_tokens, infer_micro, infer_tokens):
    """A TrainingWorker as `ActorRolloutRefWorker.init_model` configures the actor's (or the
    reference's) engine, with verl's own methods bound to it."""
    from verl.workers.engine.base import BaseEngine
    from verl.workers.engine_workers import TrainingWorker

    engine = _Engine(dp, sp)
    engine.train_batch = types.MethodType(BaseEngine.train_batch, engine)
    engine.infer_batch = types.MethodType(BaseEngine.infer_batch, engine)
    worker = types.SimpleNamespace(
        engine=engine,
        engine_config=types.SimpleNamespace(
            use_dynamic_bsz=dynamic,
            max_token_len_per_gpu=max_tokens,
            micro_batch_size_per_gpu=micro,
            infer_max_token_len_per_gpu=infer_tokens,
            infer_micro_batch_size_per_gpu=infer_micro,
            use_fused_kernels=False,
            forward_only=False,
        ),
        model_config={"use_remove_padding": True},
        loss_fn=lambda *a, **k: None,
        # a profiler that is never on (verl's DistProfiler.annotate asks it)
        profiler=types.SimpleNamespace(step=lambda: None, rank=0, check_enable=lambda: False),
    )
    for name in ("train_mini_batch", "train_batch", "infer_batch"):
        setattr(worker, name, types.MethodType(getattr(TrainingWorker, name), worker))
    return worker


def verl_refusal(config, use_reference_policy: bool) -> str | None:
    """Run verl's own batch code for `config` on its layout; the first error, or None."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import config as verl_config
    from verl.utils import tensordict_utils as tu
    from verl.workers.rollout.replica import RolloutReplica

    validate = getattr(verl_config.validate_config, "__wrapped__", verl_config.validate_config)
    get = lambda key, default=None: OmegaConf.select(config, key, default=default)  # noqa: E731
    try:
        validate(config, use_reference_policy=use_reference_policy, use_critic=False)
        world = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
        sp = get("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)
        dp = world // sp
        n = get("actor_rollout_ref.rollout.n")
        longest = get("data.max_prompt_length") + get("data.max_response_length")
        driver = types.SimpleNamespace(config=config, use_critic=False, global_steps=1)
        multiple = PPOTrainer._get_required_batch_multiple(driver, dp)
        rows = get("data.train_batch_size") * n
        rows += -rows % multiple  # padding_utils.upsample_batch_to_divisible_size
        # Sequence lengths matter only to token budgets: without dynamic batch sizes anywhere,
        # one token a row tests the same arithmetic at a fraction of the memory.
        dynamic_anywhere = any(
            get(key)
            for key in (
                "actor_rollout_ref.actor.use_dynamic_bsz",
                "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
            )
        )
        length = longest if dynamic_anywhere else 1
        share = tu.chunk_tensordict(_sequences(rows, length), dp)[0]
        # ActorRolloutRefWorker.init_model: the actor's engine settings
        dynamic = get("actor_rollout_ref.actor.use_dynamic_bsz")
        assert dynamic == get("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz")
        actor = _worker(
            dp,
            sp,
            dynamic=dynamic,
            micro=get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
            max_tokens=get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
            infer_micro=get("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
            infer_tokens=get("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"),
        )
        if dynamic:
            assert get("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") is not None
            assert get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu") is not None
        else:
            assert get("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu") is not None
            assert get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") is not None
        # old log-probs
        actor.infer_batch(share.clone())
        if use_reference_policy:
            ref_sp = get("actor_rollout_ref.ref.ulysses_sequence_parallel_size", sp)
            reference = _worker(
                world // ref_sp,
                ref_sp,
                dynamic=get("actor_rollout_ref.ref.log_prob_use_dynamic_bsz"),
                micro=None,
                max_tokens=None,
                infer_micro=get("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
                infer_tokens=get("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"),
            )
            reference.infer_batch(tu.chunk_tensordict(_sequences(rows, length), world // ref_sp)[0])
        # the update (trainer_base._update_actor's extra_info)
        update = share.clone()
        tu.assign_non_tensor(
            update,
            mini_batch_size=get("actor_rollout_ref.actor.ppo_mini_batch_size") * n,
            epochs=get("actor_rollout_ref.actor.ppo_epochs"),
            seed=1,
            dataloader_kwargs={"shuffle": False},
        )
        actor.train_mini_batch(update)
        # rollout replicas (engine_workers.init_model asserts the same tiling per worker)
        replica = type("Replica", (RolloutReplica,), {"launch_servers": lambda self: None})
        rollout = config.actor_rollout_ref.rollout
        replica(0, rollout, None, gpus_per_node=get("trainer.n_gpus_per_node"))
        gpus_per_replica = (
            rollout.tensor_model_parallel_size
            * rollout.data_parallel_size
            * rollout.pipeline_model_parallel_size
        )
        assert world % gpus_per_replica == 0, "rollout world_size is not divisible"
    except (AssertionError, ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _layout(config, nodes: int, gpus: int):
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    OmegaConf.update(config, "trainer.nnodes", nodes)
    OmegaConf.update(config, "trainer.n_gpus_per_node", gpus)
    return config


@pytest.fixture(scope="module")
def recipes(compose):
    return {name: compose(name) for name in RECIPES}


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize(("nodes", "gpus"), LAYOUTS)
def test_every_recipe_runs_on_every_listed_layout(recipes, name, nodes, gpus):
    config = _layout(recipes[name], nodes, gpus)
    assert verl_refusal(config, use_reference_policy=True) is None
    assert geometry_problems(config, use_reference_policy=True) == []


def test_the_old_caption_geometry_is_refused_as_verl_refuses_it(recipes):
    """16 prompts x n=5 per mini-batch, micro-batch 4: 10 rows per rank on 8 GPUs."""
    config = _layout(recipes["chair_mscoco"], 1, 8)
    OmegaConf.update(config, "data.train_batch_size", 64)
    OmegaConf.update(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 16)
    OmegaConf.update(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4)
    assert "force_group_size * micro_batch_size_per_gpu" in verl_refusal(config, True)
    assert geometry_problems(config, use_reference_policy=True) == [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 does not divide the 10 rows "
        "each of 8 rank(s) gets per mini-batch (16 prompts x n=5 / 8); use 1, 2, 5 or 10"
    ]
    # 64 ranks: the step (320 rows) gives each 5 rows, which the log-prob passes (10 rows) and
    # the update (80 rows per mini-batch) cannot split; verl stops at the first, we name all.
    at_64 = _layout(config, 8, 8)
    assert "force_group_size * micro_batch_size_per_gpu" in verl_refusal(at_64, True)
    problem, *log_prob_passes = geometry_problems(at_64, use_reference_policy=True)
    assert [p.split("=")[0] for p in log_prob_passes] == [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    ]
    assert problem.startswith(
        "actor_rollout_ref.actor.ppo_mini_batch_size=16 x n=5 = 80 rows per mini-batch do not "
        "split over 64 ranks"
    )
    assert problem.endswith("use actor_rollout_ref.actor.ppo_mini_batch_size=64")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        # the log-prob passes' budgets follow this one in verl's config: three problems
        (("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 4096), "ppo_max_token_len_per_gpu"),
        (
            ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", 8192),
            "rollout.log_prob_max_token_len_per_gpu",
        ),
    ],
)
def test_a_token_budget_below_the_longest_sequence_is_refused(recipes, override, key):
    config = _layout(recipes["egpo_function_calling"], 1, 8)
    OmegaConf.update(config, *override)
    assert "max_token_len must be greater" in verl_refusal(config, True)
    problems = geometry_problems(config, use_reference_policy=True)
    assert key in problems[0]
    assert all(
        "data.max_prompt_length 2048 + data.max_response_length 8192 = 10240 tokens" in p
        for p in problems
    )


def test_rollout_replicas_must_tile_the_gpus(recipes):
    config = _layout(recipes["chair_mscoco"], 1, 8)
    OmegaConf.update(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", 3)
    assert verl_refusal(config, True) is not None
    (problem,) = geometry_problems(config, use_reference_policy=True)
    assert "tensor_model_parallel_size=3" in problem and "use 1, 2, 4 or 8" in problem


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    prompts=st.integers(1, 24),
    n=st.integers(1, 6),
    mini=st.integers(1, 24),
    micro=st.integers(1, 12),
    old_micro=st.integers(1, 12),
    ref_micro=st.integers(1, 12),
    layout=st.sampled_from(((1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (1, 8), (2, 8))),
    dynamic=st.booleans(),
    budget=st.sampled_from((64, 96, 128)),
    tp=st.sampled_from((1, 2, 3)),
    reference=st.booleans(),
)
# The step padded to a multiple of the mini-batch is what the log-prob passes split: 12 prompts
# and mini-batches of 8 become 16 rows, which micro-batches of 16 (not of 12) divide.
@example(
    prompts=12,
    n=1,
    mini=8,
    micro=1,
    old_micro=16,
    ref_micro=1,
    layout=(1, 1),
    dynamic=False,
    budget=64,
    tp=1,
    reference=True,
)
@example(
    prompts=12,
    n=1,
    mini=8,
    micro=1,
    old_micro=12,
    ref_micro=1,
    layout=(1, 1),
    dynamic=False,
    budget=64,
    tp=1,
    reference=True,
)
@example(
    prompts=6,
    n=2,
    mini=4,
    micro=2,
    old_micro=16,
    ref_micro=4,
    layout=(1, 2),
    dynamic=False,
    budget=64,
    tp=1,
    reference=False,
)
def test_the_check_accepts_exactly_what_verl_accepts(
    recipes, prompts, n, mini, micro, old_micro, ref_micro, layout, dynamic, budget, tp, reference
):
    config = _layout(recipes["chair_mscoco"], *layout)
    for key, value in {
        "data.train_batch_size": prompts,
        "data.max_prompt_length": 64,
        "data.max_response_length": 32,
        "actor_rollout_ref.rollout.n": n,
        "actor_rollout_ref.actor.ppo_mini_batch_size": mini,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": old_micro,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ref_micro,
        "actor_rollout_ref.actor.use_dynamic_bsz": dynamic,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": budget,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
    }.items():
        OmegaConf.update(config, key, value)
    verl = verl_refusal(config, reference)
    ours = geometry_problems(config, use_reference_policy=reference)
    assert (verl is None) == (ours == []), (verl, ours)


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(10) == [1, 2, 5, 10]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]


def test_describe_states_the_split(recipes):
    g = batch_geometry(_layout(recipes["chair_mscoco"], 8, 8), use_reference_policy=True)
    text = "\n".join(describe(g))
    assert "8 node(s) x 8 GPU(s) = 64 GPU(s), 64 data-parallel actor rank(s)" in text
    assert "step: 512 prompts x n=5 = 2560 rows; 40 rows per rank" in text
    assert "4 mini-batch(es) x 1 epoch(s) of 128 prompts x n=5 = 640 rows, 10 rows per rank" in text
    assert "micro-batches of 5 rows (2 per rank)" in text
    assert "reference: 40 rows per rank in micro-batches of 10 rows" in text
