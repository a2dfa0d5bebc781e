"""Our Hydra configs compose with verl's trainer config and pass verl's own validation.

Composition is what `python -m verl.trainer.main_ppo --config-path configs --config-name X`
does; validation is what verl's `main` and `TaskRunner.run` do before training.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

import entropyrl.verl.plugin  # noqa: F401
from entropyrl.core.specs import SPEC_CLASSES, ClipScheduleSpec, EgpoBonusSpec, algorithm_specs
from entropyrl.verl.trainer import EntropyPPOTrainer

CONFIG_NAMES = ("chair_mscoco", "egpo_function_calling", "grpo_function_calling")
# Keys verl does not define: read by our estimators, trainer and reward functions.
OUR_PREFIXES = (
    *(f"algorithm.{spec.SECTION}." for spec in SPEC_CLASSES),
    "reward.custom_reward_function.reward_kwargs.",
    # verl passes this dict on to `vllm serve` as it is (vllm_async_server.launch_server)
    "actor_rollout_ref.rollout.engine_kwargs.vllm.",
)


def flatten(node, prefix: str = "") -> dict:
    """{dotted.path: leaf} of a plain (unresolved) container."""
    if isinstance(node, dict) and node:
        out = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


@pytest.fixture(scope="module")
def verl_base():
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer")
    return flatten(OmegaConf.to_container(cfg, resolve=False))


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_composes_and_validates(name, compose, verl_base):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    cfg = compose(name)
    # verl's main(): device, then validate_config (builds the strict ActorConfig, checks batches).
    auto_set_device(cfg)
    validate_config(
        cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
    # TaskRunner.run resolves every interpolation; only the disabled reward model's rollout name
    # may stay ??? (it does in verl's own config too).
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert OmegaConf.missing_keys(cfg) <= {"reward.reward_model.rollout.name"}
    assert not cfg.reward.reward_model.enable
    assert resolved["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    # Strict dataclasses the workers build from these sections.
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    # No unknown keys: everything exists in verl's own config, except our documented extras.
    ours = flatten(OmegaConf.to_container(cfg, resolve=False))
    unknown = [key for key in ours if key not in verl_base and not key.startswith(OUR_PREFIXES)]
    assert unknown == []
    # Every name the config selects is registered with verl.
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is EntropyPPOTrainer
    estimator = cfg.algorithm.adv_estimator
    assert estimator in {e.value for e in core_algos.AdvantageEstimator} or (
        estimator in core_algos.ADV_ESTIMATOR_REGISTRY
    )
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode in core_algos.POLICY_LOSS_REGISTRY
    assert callable(get_custom_reward_fn(cfg))


def test_chair_recipe_values(compose):
    cfg = compose("chair_mscoco")
    actor = cfg.actor_rollout_ref.actor
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.rollout.temperature == 1.0
    assert actor.optim.lr == 1e-6
    assert (actor.kl_loss_type, actor.kl_loss_coef, actor.use_kl_loss) == ("low_var_kl", 1e-2, True)
    assert (actor.clip_ratio_low, actor.clip_ratio_c) == (0.2, 3.0)
    assert actor.policy_loss.loss_mode == "per_sample_clip"
    schedule = cfg.algorithm.clip_schedule
    assert (schedule.enable, schedule.low, schedule.high, schedule.threshold) == (
        True,
        0.3,
        0.5,
        1e-4,
    )
    # Several mini-batches per step, or the clip never acts (ratio = 1 on-policy).
    assert cfg.data.train_batch_size // actor.ppo_mini_batch_size > 1
    assert inspect.iscoroutinefunction(
        __import__("entropyrl.verl.rewards", fromlist=["caption_score"]).caption_score
    )
    assert cfg.reward.custom_reward_function.name == "caption_score"


def test_egpo_and_grpo_differ_only_in_the_estimator(compose):
    egpo = flatten(OmegaConf.to_container(compose("egpo_function_calling"), resolve=False))
    grpo = flatten(OmegaConf.to_container(compose("grpo_function_calling"), resolve=False))
    assert egpo.keys() == grpo.keys()
    differing = {key for key in egpo if egpo[key] != grpo[key]}
    assert differing == {"algorithm.adv_estimator", "trainer.experiment_name"}
    assert (egpo["algorithm.adv_estimator"], grpo["algorithm.adv_estimator"]) == ("egpo", "grpo")
    # The paper's setting.
    assert egpo["actor_rollout_ref.rollout.temperature"] == 0.7
    assert egpo["actor_rollout_ref.actor.kl_loss_coef"] == 1e-3
    assert egpo["data.max_response_length"] == 8192
    assert egpo["trainer.total_epochs"] == 5
    # The paper's lambda and alpha, which are also the spec's defaults.
    assert (egpo["algorithm.egpo_bonus.lam"], egpo["algorithm.egpo_bonus.alpha"]) == (0.4, 2.0)
    assert (EgpoBonusSpec.lam, EgpoBonusSpec.alpha) == (0.4, 2.0)


def test_overrides_pass_through(compose):
    cfg = compose(
        "chair_mscoco",
        [
            "trainer.total_epochs=1",
            "algorithm.adv_estimator=egpo_ratio",
            "reward.custom_reward_function.reward_kwargs.chair_url=http://127.0.0.1:5000",
        ],
    )
    assert cfg.trainer.total_epochs == 1
    assert cfg.algorithm.adv_estimator == "egpo_ratio"
    assert cfg.reward.custom_reward_function.reward_kwargs.chair_url == "http://127.0.0.1:5000"


@pytest.mark.parametrize("name", [*CONFIG_NAMES, "egpo_ratio_mixed"])
def test_algorithm_sections_parse_without_deprecated_keys(name, compose):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recipe using a deprecated key fails here
        algorithm_specs(compose(name).algorithm)


def test_chair_recipe_agrees_with_the_spec_and_the_actor(compose):
    cfg = compose("chair_mscoco")
    specs = algorithm_specs(cfg.algorithm)
    # The recipe's bounds are the EntropyRL values, which are also the spec defaults.
    expected = ClipScheduleSpec(enable=True)
    assert specs.clip_schedule == expected
    # Samples without a bound use the actor's clip_high: the schedule's neutral (low) value,
    # written once (an interpolation) so the two cannot disagree.
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == specs.clip_schedule.low
    overridden = compose("chair_mscoco", ["algorithm.clip_schedule.low=0.25"])
    assert overridden.actor_rollout_ref.actor.clip_ratio_high == 0.25


def _main_ppo(repo_root, tmp_path, *overrides: str, env=None):
    import os
    import subprocess
    import sys

    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env["RAY_ADDRESS"] = "127.0.0.1:1"  # nothing to connect to: reaching Ray would fail
    full_env.update(env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            "--config-path",
            str(repo_root / "configs"),
            "--config-name",
            "chair_mscoco",
            *overrides,
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ("+algorithm.clip_schedule.treshold=0.1",),
            "error: algorithm.clip_schedule: unknown key 'treshold'; accepted: enable, rule, low, "
            "high, threshold, direction, neutral, saturation, temperature",
        ),
        (  # the recipe's schedule is on: the token clip beside it contradicts it
            ("algorithm.token_clip.enable=true",),
            "error: algorithm.token_clip.enable=true contradicts "
            "algorithm.clip_schedule.enable=true (both set hallucinating samples' bounds): set "
            "one of them false",
        ),
        (  # the token clip trains with the per-sample loss: another loss contradicts it
            (
                "algorithm.clip_schedule.enable=false",
                "algorithm.token_clip.enable=true",
                "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            ),
            "error: algorithm.token_clip.enable=true trains with the per_sample_clip loss, which "
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo contradicts; drop the loss_mode "
            "override, or set algorithm.token_clip.enable=false",
        ),
        (
            ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",),
            "error: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 does not divide the "
            "80 rows each of 8 rank(s) gets per mini-batch (128 prompts x n=5 / 8); use 1, 2, 4, 5, "
            "8 or 10",
        ),
    ],
)
def test_a_config_that_cannot_run_stops_main_ppo_in_one_line(
    tmp_path, repo_root, overrides, expected
):
    """verl's main_ppo validates before `ray.init`; the plugin's checks stop it there, one line
    each, exit 2, no traceback (HYDRA_FULL_ERROR=1 gives the full one)."""
    result = _main_ppo(repo_root, tmp_path, *overrides)
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [expected]
    assert "Traceback" not in result.stderr
    assert "ray init kwargs" not in result.stdout
    if "treshold" in expected:  # the full traceback on request (one refusal is enough: same path)
        full = _main_ppo(repo_root, tmp_path, *overrides, env={"HYDRA_FULL_ERROR": "1"})
        assert full.returncode == 1
        assert "Traceback" in full.stderr and "ConfigRefusal" in full.stderr


def test_validate_config_raises_when_called_from_python(compose):
    from verl.utils.config import validate_config

    from entropyrl.verl.checks.validation import ConfigRefusal

    config = compose("chair_mscoco", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    with pytest.raises(ConfigRefusal) as refusal:
        validate_config(config, use_reference_policy=True, use_critic=False)
    (problem,) = refusal.value.problems
    assert problem.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 does not")


# -- the caption recipe's start-up and memory settings -------------------------------------------


def verl_vllm_cli_args(args: dict) -> list[str]:
    """verl's own `build_cli_args_from_config` (vllm_rollout/utils.py), read from its source:
    the module imports vLLM, which a CPU machine does not have; the function itself needs only
    `json` for these values (and vLLM's engine arguments for a False flag, absent here)."""
    import ast
    import importlib.util
    import json

    spec = importlib.util.find_spec("verl.workers.rollout")  # its vllm_rollout imports vLLM
    folder = Path(next(iter(spec.submodule_search_locations))) / "vllm_rollout"
    source = (folder / "utils.py").read_text()
    tree = ast.parse(source)
    (function,) = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "build_cli_args_from_config"
    ]
    namespace = {"json": json, "Any": object}
    exec(compile(ast.Module([function], []), "verl_utils", "exec"), namespace)
    assert not any(value is False for value in args.values())
    return namespace["build_cli_args_from_config"](args)


def test_vllm_gets_one_image_no_video_and_the_runs_context(compose):
    """What verl's vLLM server hands `vllm serve` for the recipe (`launch_server`: the rollout
    config's `max_model_len` and its `engine_kwargs.vllm`, dicts as JSON)."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose("chair_mscoco")
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    engine = {k: v for k, v in (rollout.engine_kwargs.get("vllm") or {}).items() if v is not None}
    args = verl_vllm_cli_args({"max_model_len": rollout.max_model_len, **engine})
    assert args == [
        "--max_model_len",
        "1280",
        "--limit_mm_per_prompt",
        '{"image": 1, "video": 0}',
    ]
    assert rollout.max_model_len == cfg.data.max_prompt_length + cfg.data.max_response_length


def test_validation_runs_in_bounded_batches_and_verl_does_not_filter(compose):
    cfg = compose("chair_mscoco")
    assert cfg.data.val_batch_size == cfg.data.train_batch_size == 512  # n=1: 512 captions
    assert cfg.data.filter_overlong_prompts is False  # the preflight proves the bound
    for name in ("chair_mscoco", "egpo_function_calling", "egpo_ratio_mixed"):
        assert list(compose(name).trainer.logger) == ["console", "file"]


def test_a_training_set_smaller_than_a_step_is_refused(compose, tmp_path):
    from entropyrl.core.files import write_parquet
    from entropyrl.verl.checks.validation import data_problems

    data = tmp_path / "train.parquet"
    write_parquet([{"prompt": [{"role": "user", "content": "hi"}]}] * 3, data)
    cfg = compose("chair_mscoco", [f"data.train_files={data}", "data.train_batch_size=4"])
    assert data_problems(cfg) == [
        f"data.train_files hold 3 row(s) ({data}), fewer than data.train_batch_size=4: no "
        "training step would run; prepare more data or lower data.train_batch_size"
    ]
    cfg = compose("chair_mscoco", [f"data.train_files={data}", "data.train_batch_size=3"])
    assert data_problems(cfg) == []
    (tmp_path / "empty.parquet").write_bytes(b"")  # not parquet: verl's own error
    assert (
        data_problems(compose("chair_mscoco", [f"data.train_files={tmp_path}/empty.parquet"])) == []
    )


def test_a_run_with_no_step_fails_instead_of_saying_nothing_is_left(compose):
    """verl sets total_training_steps to len(dataset) // train_batch_size: a training set the
    filter emptied gives 0 steps, which the trainer refuses in a line naming the filter."""
    import types

    cfg = compose("chair_mscoco", ["data.filter_overlong_prompts=true"])
    trainer = types.SimpleNamespace(
        config=cfg, global_steps=0, total_training_steps=0, train_dataset=[]
    )
    with pytest.raises(RuntimeError) as error:
        EntropyPPOTrainer.fit(trainer, agent_loop_manager=None)
    assert str(error.value).startswith(
        "no training step: the training set holds 0 row(s) after verl's dataset read"
    )
    assert "fewer than data.train_batch_size=512 (data.filter_overlong_prompts=true" in str(
        error.value
    )


def test_the_metrics_file_defaults_to_the_checkpoint_folder(compose):
    from entropyrl.verl.trainer import default_metrics_path

    cfg = compose("chair_mscoco", ["trainer.default_local_dir=/runs/a"])
    assert default_metrics_path(cfg, {}) == "/runs/a/metrics.jsonl"
    assert default_metrics_path(cfg, {"VERL_FILE_LOGGER_PATH": "/elsewhere.jsonl"}) is None
    console = compose("chair_mscoco", ["trainer.logger=[console]"])
    assert default_metrics_path(console, {}) is None


def test_a_run_of_verls_own_trainer_keeps_verls_behaviour(compose, tmp_path):
    """The refusals that change what verl would do (an estimator verl does not know yet, a
    training set smaller than a step, the prompt bound) apply to the entropy-aware trainer's
    runs only: the plugin loads into every verl process."""
    from entropyrl.core.files import write_parquet
    from entropyrl.verl.checks.validation import config_problems

    data = tmp_path / "train.parquet"
    write_parquet([{"prompt": [{"role": "user", "content": "hi"}]}] * 3, data)
    odd = [
        f"data.train_files={data}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.n_gpus_per_node=1",
        "algorithm.adv_estimator=registered_later",
        "actor_rollout_ref.rollout.max_model_len=100",
    ]
    ours = config_problems(compose("chair_mscoco", odd), use_reference_policy=True)
    assert len(ours) == 3  # the estimator, the rows, the context
    # verl's own trainer, with our schedule off (switched on, it is refused: the schedule is
    # ours, and that trainer would ignore it; tests/verl/test_trainer_hook.py)
    verls = compose(
        "chair_mscoco",
        [*odd, "trainer.v1.trainer_mode=sync", "algorithm.clip_schedule.enable=false"],
    )
    assert config_problems(verls, use_reference_policy=True) == []
