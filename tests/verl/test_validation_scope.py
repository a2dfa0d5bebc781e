"""The plugin changes only its own runs: verl loads it into every process of the environment, so a
run that uses none of its parts (no entropyrl trainer, estimator or loss) must be validated by
`verl.utils.config.validate_config` with the plugin loaded exactly as by verl's function alone:
the same acceptance, the same exception with the same message, the same exit. The control rows
show the same configs with one of our parts refused by our checks, so the table can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

from verl.utils import config as verl_config  # noqa: E402

from entropyrl.verl.checks import checkpoints, validation  # noqa: E402

VERL_CONFIGS = Path(verl.__file__).parent / "trainer" / "config"
# A small GRPO run of verl's own config: every batch size set, one GPU.
BASE = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.model.path=/models/any",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "trainer.n_gpus_per_node=1",
]
ANOTHER_RUN = "another run's checkpoint in the folder"
# name -> overrides of verl's ppo_trainer config; each a run our checks would judge otherwise
PLAIN_RUNS = {
    "a plain GRPO run": [],
    # verl raises its own ValueError; ours words it otherwise (and adds a tensor-parallel line)
    "no rollout micro-batch": ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"],
    # verl accepts it here and fails later; our geometry check refuses it before Ray
    "a rollout replica wider than the node": [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4"
    ],
    # verl's own assertion, before ours would have said anything
    "a step that does not divide over the GPUs": ["trainer.n_gpus_per_node=3"],
    # the folder of another run (ANOTHER_RUN): our resume check refuses to continue it
    ANOTHER_RUN: ["trainer.total_training_steps=5"],
}
OUR_PARTS = {
    "trainer": "trainer.v1.trainer_mode=entropyrl",
    "estimator": "algorithm.adv_estimator=egpo",
    "loss": "actor_rollout_ref.actor.policy_loss.loss_mode=per_sample_clip",
}


def compose_verl(overrides: list[str], folder: Path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(VERL_CONFIGS), version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[*BASE, f"trainer.default_local_dir={folder}", *overrides],
        )


def outcome(function, config) -> tuple[str, str]:
    try:
        function(config, use_reference_policy=True, use_critic=False)
    except BaseException as error:  # SystemExit included: the exit is part of the behaviour
        return type(error).__name__, str(error)
    return "accepted", ""


def folder_for(name: str, tmp_path: Path) -> Path:
    """The run's checkpoint folder: empty, or for ANOTHER_RUN one at step 3 written by a run with
    other settings."""
    folder = tmp_path / "checkpoints"
    if name == ANOTHER_RUN:
        other = compose_verl(["algorithm.adv_estimator=rloo"], folder)
        checkpoints.write_settings(folder, other, 3)
        (folder / checkpoints.LATEST_FILE).write_text("3")
    return folder


@pytest.fixture()
def command_line(monkeypatch):
    """As under main_ppo's Hydra command line, where our refusals exit 2 and the resume check
    runs (called from Python they raise, and the resume check stands aside)."""
    monkeypatch.setattr(validation, "_hydra_command_line", lambda: True)


def test_the_plugin_wraps_verls_validation() -> None:
    assert getattr(verl_config.validate_config, "_entropyrl", False)
    assert verl_config.validate_config.__wrapped__.__module__ == "verl.utils.config"


@pytest.mark.parametrize("name", PLAIN_RUNS)
def test_a_run_without_our_parts_is_validated_as_verl_alone_does(
    name, tmp_path, command_line
) -> None:
    config = compose_verl(PLAIN_RUNS[name], folder_for(name, tmp_path))
    assert not validation.uses_entropyrl(config)
    alone = outcome(verl_config.validate_config.__wrapped__, config)
    assert outcome(verl_config.validate_config, config) == alone


@pytest.mark.parametrize("part", OUR_PARTS)
def test_a_run_with_one_of_our_parts_gets_our_checks(part, tmp_path, command_line):
    # the control: the same geometry, the same folder, with one part of the plugin in use
    for name in ("a rollout replica wider than the node", ANOTHER_RUN):
        folder = folder_for(name, tmp_path / str(len(name)))
        config = compose_verl([*PLAIN_RUNS[name], OUR_PARTS[part]], folder)
        assert validation.uses_entropyrl(config)
        alone = outcome(verl_config.validate_config.__wrapped__, config)
        ours = outcome(verl_config.validate_config, config)
        assert ours[0] == "SystemExit" and ours != alone, (name, ours, alone)


def test_the_folder_really_holds_another_run(tmp_path) -> None:
    folder = folder_for(ANOTHER_RUN, tmp_path)
    saved = json.loads((folder / checkpoints.SETTINGS_FILE).read_text())
    assert saved["step"] == 3
    config = compose_verl([OUR_PARTS["trainer"]], folder)
    assert checkpoints.resume_decision(config).kind == "other_run"


ENTROPY_UNDER_VERL = {
    "verl's sync trainer": ["algorithm.adv_estimator=egpo", "trainer.v1.trainer_mode=sync"],
    "our mode on verl's legacy trainer": [
        "algorithm.adv_estimator=egpo_ratio",
        "trainer.v1.trainer_mode=entropyrl",
        "trainer.use_v1=false",
    ],
}


@pytest.mark.parametrize("name", ENTROPY_UNDER_VERL)
def test_an_entropy_estimator_under_verls_own_trainer_is_refused(name, tmp_path, command_line):
    """verl's own trainer pops the entropies before the estimator runs: it would train plain
    GRPO without a word. Refused in one line, exit 2, from verl's validation in main_ppo."""
    config = compose_verl(ENTROPY_UNDER_VERL[name], tmp_path / "ckpt")
    assert not validation.uses_our_trainer(config)
    problems = validation.config_problems(config, use_reference_policy=True)
    estimator = config.algorithm.adv_estimator
    assert [p for p in problems if "per-token entropy" in p] == [
        f"algorithm.adv_estimator={estimator} reads per-token entropy, which only the "
        "entropy-aware trainer (trainer.v1.trainer_mode=entropyrl with trainer.use_v1=true) "
        "hands it: verl's own trainer would train plain GRPO; set it, or "
        "algorithm.adv_estimator=grpo"
    ]
    with pytest.raises(SystemExit) as stopped:
        verl_config.validate_config(config, use_reference_policy=True, use_critic=False)
    assert stopped.value.code == 2


def test_an_entropy_estimator_under_our_trainer_is_not_refused_for_it(tmp_path) -> None:
    config = compose_verl(
        ["algorithm.adv_estimator=egpo", "trainer.v1.trainer_mode=entropyrl"], tmp_path / "ckpt"
    )
    assert validation.uses_our_trainer(config)
    problems = validation.config_problems(config, use_reference_policy=True)
    assert not [p for p in problems if "per-token entropy" in p]


@pytest.mark.parametrize("section", validation.TOKEN_SECTIONS)
@pytest.mark.parametrize("mode", ["sync", "entropyrl"])
def test_a_token_level_section_needs_the_entropy_aware_trainer(section, mode, tmp_path):
    """The entropy-aware trainer maps the reward's spans to tokens; verl's own trainer never
    reads them: switched on there, a run would train as if it were off, so it is refused in one
    line naming the switch. Under ours it is the plugin's and not refused for it."""
    config = compose_verl(
        [f"trainer.v1.trainer_mode={mode}", f"+algorithm.{section}.enable=true"],
        tmp_path / "ckpt",
    )
    assert validation.uses_entropyrl(config)
    problems = validation.config_problems(config, use_reference_policy=True)
    named = [p for p in problems if f"algorithm.{section}.enable=true" in p]
    if mode == "sync":
        assert named == [
            f"algorithm.{section}.enable=true needs the entropy-aware trainer "
            "(trainer.v1.trainer_mode=entropyrl): verl's own trainer never reads the "
            f"hallucinated tokens; set it, or algorithm.{section}.enable=false"
        ]
    else:
        assert named == []
    off = compose_verl(
        [f"trainer.v1.trainer_mode={mode}", f"+algorithm.{section}.enable=false"],
        tmp_path / "ckpt",
    )
    assert not [
        p
        for p in validation.config_problems(off, use_reference_policy=True)
        if f"algorithm.{section}" in p
    ]
