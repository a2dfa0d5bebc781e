"""The batch arithmetic verl 0.9.1 asserts inside its workers, checked before anything starts.

verl splits a training step in four places, and three of them assert divisibility only after
Ray, the workers, the rollout, the old-log-prob and the reference passes have run:

- the driver pads the step (`data.train_batch_size` x `rollout.n` rows) to a multiple of
  lcm(data-parallel size, mini-batch rows) (`trainer_base._get_required_batch_multiple`,
  `padding_utils.upsample_batch_to_divisible_size`) and hands each rank an equal share;
- the actor update splits the mini-batch (`ppo_mini_batch_size` x `rollout.n` rows) over the
  ranks and asserts that it divides (`engine_workers.TrainingWorker.train_mini_batch`);
- each rank's share is cut into micro-batches of `*_micro_batch_size_per_gpu` rows and
  `engine/utils.py:prepare_micro_batches` asserts that they divide it (update: the mini-batch
  share; old log-probs: `rollout.log_prob_micro_batch_size_per_gpu`; reference:
  `ref.log_prob_micro_batch_size_per_gpu`), unless dynamic batch sizes are on, when one
  sequence must fit the token budget instead (`seqlen_balancing.rearrange_micro_batches`);
- verl's own `validate_config` (before Ray) checks the step rows against the GPU count, and the
  rollout worker asserts that its replicas tile the GPUs.

`batch_geometry` is a pure function of the resolved config (a DictConfig or a plain mapping);
`geometry_problems` turns what would assert into one line each, with the keys, the arithmetic
and values that would work. `tests/verl/test_geometry.py` runs verl's own functions over a table
of recipes x layouts and checks that this mirror accepts exactly what verl does not assert.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"


def _get(config: Any, key: str, default: Any = None) -> Any:
    """`a.b.c` of a DictConfig or nested mappings (interpolations resolved), else `default`."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
            return default if value is None else value
    except ImportError:  # pragma: no cover - omegaconf comes with verl and hydra
        pass
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order (n >= 1)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _choices(values: list[int], near: int | None = None, limit: int = 6) -> str:
    """'1, 2, 5 or 10': at most `limit` values, those nearest `near` when there are more."""
    if near is not None and len(values) > limit:
        values = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:limit])
    else:
        values = values[:limit]
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@dataclass(frozen=True)
class LogProbPass:
    """One forward-only pass over the step (old log-probs or the reference)."""

    name: str  # "old log-probs" | "reference"
    section: str  # config section holding its micro-batch keys
    dynamic: bool
    micro_batch: int | None  # rows per micro-batch (fixed sizes)
    max_tokens: int | None  # tokens per micro-batch (dynamic sizes), x sequence parallelism
    data_parallel: int


@dataclass(frozen=True)
class BatchGeometry:
    """How one training step is split, as verl 0.9.1 splits it (sync trainer, FSDP engine)."""

    nnodes: int
    gpus_per_node: int
    world_size: int
    data_parallel: int  # actor ranks: world / Ulysses sequence parallelism
    prompts_per_step: int
    n: int
    step_rows: int
    batch_multiple: int  # the driver pads the step to a multiple of this
    padded_step_rows: int
    mini_batch_prompts: int
    mini_batch_rows: int
    ppo_epochs: int
    dynamic: bool
    micro_batch: int | None
    max_tokens: int | None
    max_prompt: int  # data.max_prompt_length
    max_response: int  # data.max_response_length
    log_prob_passes: tuple[LogProbPass, ...]
    rollout_tp: int  # GPUs per rollout replica (tensor x data x pipeline parallel)

    @property
    def max_sequence(self) -> int:
        return self.max_prompt + self.max_response

    @property
    def step_rows_per_rank(self) -> int:
        return self.padded_step_rows // self.data_parallel

    @property
    def padding_rows(self) -> int:
        return self.padded_step_rows - self.step_rows

    @property
    def mini_batches(self) -> int:
        return self.padded_step_rows // self.mini_batch_rows if self.mini_batch_rows else 0

    @property
    def mini_rows_per_rank(self) -> int | None:
        if self.mini_batch_rows % self.data_parallel:
            return None
        return self.mini_batch_rows // self.data_parallel


def batch_geometry(
    config: Any,
    *,
    use_reference_policy: bool,
    use_critic: bool = False,
    nnodes: int | None = None,
    gpus_per_node: int | None = None,
) -> BatchGeometry:
    """The step's split for `config` on `nnodes` x `gpus_per_node` (default: the config's)."""
    nnodes = int(nnodes if nnodes is not None else _get(config, "trainer.nnodes", 1))
    gpus_per_node = int(
        gpus_per_node if gpus_per_node is not None else _get(config, "trainer.n_gpus_per_node", 1)
    )
    world = nnodes * gpus_per_node
    sp = int(_get(config, f"{ACTOR}.ulysses_sequence_parallel_size", 1))
    dp = max(world // sp, 1)
    prompts = int(_get(config, "data.train_batch_size"))
    n = int(_get(config, f"{ROLLOUT}.n", 1))
    step_rows = prompts * n
    mini_prompts = int(_get(config, f"{ACTOR}.ppo_mini_batch_size"))
    mini_rows = mini_prompts * n
    # trainer_base._get_required_batch_multiple (critic warm-up 0: the actor updates at step 1)
    multiple = dp
    if use_critic:
        multiple = math.lcm(multiple, int(_get(config, "critic.ppo_mini_batch_size")) * n)
    multiple = math.lcm(multiple, mini_rows) if mini_rows > 0 else multiple
    padded = -(-step_rows // multiple) * multiple if multiple > 0 else step_rows
    dynamic = bool(_get(config, f"{ACTOR}.use_dynamic_bsz", False))

    def micro(key: str) -> int | None:
        value = _get(config, key)
        return None if value is None else int(value)

    passes = [
        LogProbPass(
            name="old log-probs",
            section=ROLLOUT,
            dynamic=bool(_get(config, f"{ROLLOUT}.log_prob_use_dynamic_bsz", dynamic)),
            micro_batch=micro(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
            max_tokens=_tokens(config, f"{ROLLOUT}.log_prob_max_token_len_per_gpu", sp),
            data_parallel=dp,
        )
    ]
    lora = int(_get(config, "actor_rollout_ref.model.lora_rank", 0) or 0) > 0 or (
        _get(config, "actor_rollout_ref.model.lora_adapter_path") is not None
    )
    if use_reference_policy and not lora:
        ref_sp = int(_get(config, f"{REF}.ulysses_sequence_parallel_size", sp))
        passes.append(
            LogProbPass(
                name="reference",
                section=REF,
                dynamic=bool(_get(config, f"{REF}.log_prob_use_dynamic_bsz", dynamic)),
                micro_batch=micro(f"{REF}.log_prob_micro_batch_size_per_gpu"),
                max_tokens=_tokens(config, f"{REF}.log_prob_max_token_len_per_gpu", ref_sp),
                data_parallel=max(world // ref_sp, 1),
            )
        )
    elif use_reference_policy:  # LoRA: the actor computes it with the adapter disabled
        passes.append(
            LogProbPass(
                name="reference (the actor, adapter off)",
                section=ROLLOUT,
                dynamic=passes[0].dynamic,
                micro_batch=passes[0].micro_batch,
                max_tokens=passes[0].max_tokens,
                data_parallel=dp,
            )
        )
    rollout_gpus = (
        int(_get(config, f"{ROLLOUT}.tensor_model_parallel_size", 1))
        * int(_get(config, f"{ROLLOUT}.data_parallel_size", 1))
        * int(_get(config, f"{ROLLOUT}.pipeline_model_parallel_size", 1))
    )
    return BatchGeometry(
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        world_size=world,
        data_parallel=dp,
        prompts_per_step=prompts,
        n=n,
        step_rows=step_rows,
        batch_multiple=multiple,
        padded_step_rows=padded,
        mini_batch_prompts=mini_prompts,
        mini_batch_rows=mini_rows,
        ppo_epochs=int(_get(config, f"{ACTOR}.ppo_epochs", 1)),
        dynamic=dynamic,
        micro_batch=micro(f"{ACTOR}.ppo_micro_batch_size_per_gpu"),
        max_tokens=_tokens(config, f"{ACTOR}.ppo_max_token_len_per_gpu", sp),
        max_prompt=int(_get(config, "data.max_prompt_length")),
        max_response=int(_get(config, "data.max_response_length")),
        log_prob_passes=tuple(passes),
        rollout_tp=rollout_gpus,
    )


def _tokens(config: Any, key: str, sp: int) -> int | None:
    value = _get(config, key)
    return None if value is None else int(value) * sp


def _layout(g: BatchGeometry) -> str:
    return f"{g.nnodes} node(s) x {g.gpus_per_node} GPU(s) = {g.data_parallel} rank(s)"


def geometry_problems(
    config: Any,
    *,
    use_reference_policy: bool,
    use_critic: bool = False,
    nnodes: int | None = None,
    gpus_per_node: int | None = None,
) -> list[str]:
    """What verl 0.9.1 would assert for this config and layout: one line each, with a fix."""
    g = batch_geometry(
        config,
        use_reference_policy=use_reference_policy,
        use_critic=use_critic,
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
    )
    problems: list[str] = []
    if g.world_size < 1:
        return [
            f"trainer.nnodes={g.nnodes} x trainer.n_gpus_per_node={g.gpus_per_node} is no GPU "
            "at all; set trainer.n_gpus_per_node (or N_GPUS) to the GPUs of each node"
        ]
    mini, n, dp = g.mini_batch_prompts, g.n, g.data_parallel
    if mini < 1 or g.prompts_per_step < 1 or n < 1:
        return [
            f"data.train_batch_size={g.prompts_per_step}, {ACTOR}.ppo_mini_batch_size={mini} "
            f"and {ROLLOUT}.n={n} must all be at least 1"
        ]
    # verl/utils/config.py:validate_config and ActorConfig.validate (fixed micro-batch sizes)
    if not g.dynamic and g.step_rows % g.world_size:
        step = g.world_size // math.gcd(g.world_size, n)
        problems.append(
            f"data.train_batch_size={g.prompts_per_step} x {ROLLOUT}.n={n} = {g.step_rows} rows "
            f"per step do not split over {g.world_size} GPUs (verl's validate_config); use a "
            f"multiple of {step} prompts, e.g. data.train_batch_size="
            f"{-(-g.prompts_per_step // step) * step}"
        )
    if not g.dynamic and g.prompts_per_step < mini:
        problems.append(
            f"data.train_batch_size={g.prompts_per_step} is smaller than "
            f"{ACTOR}.ppo_mini_batch_size={mini}: a step must hold at least one mini-batch"
        )
    # engine_workers.TrainingWorker.train_mini_batch: the mini-batch splits over the ranks
    per_rank = g.mini_rows_per_rank
    if per_rank is None:
        step = dp // math.gcd(dp, n)
        options = [
            m for m in range(step, g.prompts_per_step + 1, step) if g.prompts_per_step % m == 0
        ]
        fix = (
            f"use {ACTOR}.ppo_mini_batch_size={_choices(options, near=mini)}"
            if options
            else f"use a multiple of {step} prompts for {ACTOR}.ppo_mini_batch_size and a "
            f"multiple of it for data.train_batch_size (e.g. {step} and {4 * step})"
        )
        problems.append(
            f"{ACTOR}.ppo_mini_batch_size={mini} x n={n} = {g.mini_batch_rows} rows per "
            f"mini-batch do not split over {dp} ranks ({_layout(g)}); {fix}"
        )
    elif g.dynamic:
        problems += _token_budget(f"{ACTOR}.ppo_max_token_len_per_gpu", g.max_tokens, g, "update")
    elif g.micro_batch is None:
        problems.append(
            f"{ACTOR}.ppo_micro_batch_size_per_gpu is not set (needed while use_dynamic_bsz is "
            f"false); each of {dp} ranks gets {per_rank} rows per mini-batch: use "
            f"{_choices(divisors(per_rank), near=4)}"
        )
    elif g.micro_batch < 1 or per_rank % g.micro_batch:
        problems.append(
            f"{ACTOR}.ppo_micro_batch_size_per_gpu={g.micro_batch} does not divide the "
            f"{per_rank} rows each of {dp} rank(s) gets per mini-batch ({mini} prompts x n={n} / "
            f"{dp}); use {_choices(divisors(per_rank), near=g.micro_batch)}"
        )
    # engine_workers.init_model: the actor's old-log-prob pass batches as the update does
    old = g.log_prob_passes[0]
    if old.dynamic != g.dynamic:
        problems.append(
            f"{ROLLOUT}.log_prob_use_dynamic_bsz={str(old.dynamic).lower()} differs from "
            f"{ACTOR}.use_dynamic_bsz={str(g.dynamic).lower()} (verl's actor worker asserts "
            "they are equal); leave the former unset"
        )
    # engine/utils.py:prepare_micro_batches on each rank's share of the padded step
    for log_pass in g.log_prob_passes:
        if g.padded_step_rows % log_pass.data_parallel:
            problems.append(
                f"the {log_pass.name} pass runs on {log_pass.data_parallel} ranks, which do not "
                f"divide the {g.padded_step_rows} rows of a step; give {log_pass.section} the "
                f"actor's ulysses_sequence_parallel_size"
            )
            continue
        rows = g.padded_step_rows // log_pass.data_parallel
        key = f"{log_pass.section}.log_prob_micro_batch_size_per_gpu"
        if log_pass.dynamic:
            problems += _token_budget(
                f"{log_pass.section}.log_prob_max_token_len_per_gpu",
                log_pass.max_tokens,
                g,
                log_pass.name,
            )
        elif log_pass.micro_batch is None:
            problems.append(
                f"{key} is not set (needed while use_dynamic_bsz is false); each rank gets "
                f"{rows} rows of the step: use {_choices(divisors(rows), near=8)}"
            )
        elif log_pass.micro_batch < 1 or rows % log_pass.micro_batch:
            problems.append(
                f"{key}={log_pass.micro_batch} does not divide the {rows} rows each of "
                f"{log_pass.data_parallel} rank(s) gets per step for the {log_pass.name} pass "
                f"({g.padded_step_rows} rows / {log_pass.data_parallel}); use "
                f"{_choices(divisors(rows), near=log_pass.micro_batch)}"
            )
    # rollout/replica.py and engine_workers.py: replicas tile the GPUs
    tp = g.rollout_tp
    replica_per_node = min(g.gpus_per_node, tp)
    if tp < 1 or g.world_size % tp or tp % replica_per_node:
        fits = [d for d in divisors(g.gpus_per_node)]
        problems.append(
            f"{ROLLOUT}.tensor_model_parallel_size={tp} (GPUs per rollout replica) does not "
            f"tile {g.world_size} GPUs ({g.nnodes} node(s) x {g.gpus_per_node}); use "
            f"{_choices(fits, near=tp)}"
        )
    return problems


def _token_budget(key: str, budget: int | None, g: BatchGeometry, what: str) -> list[str]:
    longest = g.max_sequence
    if budget is None:
        return [f"{key} is not set (needed while use_dynamic_bsz is true); use at least {longest}"]
    if budget < longest:
        return [
            f"{key}={budget} is below the longest sequence of the {what} pass, "
            f"data.max_prompt_length {g.max_prompt} + data.max_response_length "
            f"{g.max_response} = {longest} tokens; use at least {longest}"
        ]
    return []


def describe(g: BatchGeometry) -> list[str]:
    """The split of one step in words: what `--dry-run` prints."""
    lines = [
        f"layout: {g.nnodes} node(s) x {g.gpus_per_node} GPU(s) = {g.world_size} GPU(s), "
        f"{g.data_parallel} data-parallel actor rank(s)",
        f"step: {g.prompts_per_step} prompts x n={g.n} = {g.step_rows} rows"
        + (
            f", padded with {g.padding_rows} no-op rows to {g.padded_step_rows} (a multiple of "
            f"{g.batch_multiple})"
            if g.padding_rows
            else ""
        )
        + f"; {g.step_rows_per_rank} rows per rank",
    ]
    per_rank = g.mini_rows_per_rank
    update = (
        f"update: {g.mini_batches} mini-batch(es) x {g.ppo_epochs} epoch(s) of "
        f"{g.mini_batch_prompts} prompts x n={g.n} = {g.mini_batch_rows} rows"
    )
    if per_rank is not None:
        update += f", {per_rank} rows per rank"
        if g.dynamic:
            update += f" in micro-batches of at most {g.max_tokens} tokens (dynamic batch sizes)"
        elif g.micro_batch:
            update += f" in micro-batches of {g.micro_batch} rows" + (
                f" ({per_rank // g.micro_batch} per rank)" if per_rank % g.micro_batch == 0 else ""
            )
    lines.append(update)
    for log_pass in g.log_prob_passes:
        rows = g.padded_step_rows // max(log_pass.data_parallel, 1)
        if log_pass.dynamic:
            how = f"micro-batches of at most {log_pass.max_tokens} tokens"
        else:
            how = f"micro-batches of {log_pass.micro_batch} rows"
        lines.append(f"{log_pass.name}: {rows} rows per rank in {how}")
    lines.append(
        f"rollout: {g.world_size // g.rollout_tp if g.rollout_tp else '?'} replica(s) of "
        f"{g.rollout_tp} GPU(s)"
    )
    if g.mini_batches * g.ppo_epochs < 2:
        lines.append(
            "note: one mini-batch and one epoch per step keep the PPO ratio at 1, so clip "
            "bounds (per-sample or not) never act"
        )
    return lines
