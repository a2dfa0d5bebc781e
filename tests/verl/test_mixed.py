"""The mixed math + code recipe with verl 0.9.1: config composition and validation, the parquet
of `entropyrl prepare mixed-debug` read by `RLHFDataset`, and verl's reward loop (the naive
reward manager, as `load_reward_manager` builds it from the config) loading the hybrid reward by
path and scoring real rows, their reference answers and wrong ones."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import entropyrl.verl.plugin  # noqa: F401  (registers the estimators and the trainer)
from entropyrl.cli import main as entropyrl_main
from entropyrl.verl.trainer import EntropyPPOTrainer

pytest.importorskip("math_verify")

CONFIG = "egpo_ratio_mixed"


@pytest.fixture(scope="module")
def tokenizer():
    module = pytest.importorskip("entropyrl.rig.tokenizer")
    return module.build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def mixed_parquet(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    assert entropyrl_main(["prepare", "mixed-debug", "--out", str(out)]) in (0, None)
    return out


def test_config_composes_and_validates(compose):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    cfg = compose(CONFIG)
    auto_set_device(cfg)
    validate_config(
        cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
    OmegaConf.to_container(cfg, resolve=True)
    assert OmegaConf.missing_keys(cfg) <= {"reward.reward_model.rollout.name"}
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is EntropyPPOTrainer
    assert cfg.algorithm.adv_estimator in core_algos.ADV_ESTIMATOR_REGISTRY
    assert callable(get_custom_reward_fn(cfg))


def test_recipe_values(compose):
    cfg = compose(CONFIG)
    assert cfg.algorithm.adv_estimator == "egpo_ratio"
    ratio = cfg.algorithm.egpo_ratio
    assert (cfg.algorithm.entropy.mode, ratio.lambda_min, ratio.lambda_max) == ("answer", 0.5, 2.0)
    reward = cfg.reward.custom_reward_function
    assert (reward.path, reward.name) == ("pkg://entropyrl.verl.rewards", "hybrid_score")
    assert reward.reward_kwargs.code_backend == "local"
    actor = cfg.actor_rollout_ref.actor
    assert cfg.data.train_batch_size // actor.ppo_mini_batch_size > 1  # the clip can act


def test_reward_kwargs_reach_the_function(compose):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = compose(CONFIG, ["reward.custom_reward_function.reward_kwargs.unknown_ability=zero"])
    fn = get_custom_reward_fn(cfg)
    result = fn(data_source="x", solution_str="1", ground_truth="1", extra_info={"ability": "?"})
    assert result["route"] == "none" and result["score"] == 0.0


def test_rlhf_dataset_reads_mixed_parquet(compose, tokenizer, mixed_parquet, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    data = OmegaConf.to_container(compose(CONFIG), resolve=True)["data"]
    data["cache_dir"] = str(tmp_path / "cache")
    config = OmegaConf.create(data)
    assert config.filter_overlong_prompts  # verl tokenizes every prompt to filter
    train = RLHFDataset(str(mixed_parquet / "train.parquet"), tokenizer, config)
    assert len(train) == 32
    abilities = [train[i]["extra_info"]["ability"] for i in range(len(train))]
    assert abilities.count("math") == abilities.count("code") == 16
    code_row = train[1]
    assert code_row["data_source"] == "entropyrl/mixed_debug_code"
    assert json.loads(code_row["reward_model"]["ground_truth"])["inputs"]
    assert code_row["raw_prompt"][0]["role"] == "user"
    batch = collate_fn([train[i] for i in range(4)])
    assert len(batch["raw_prompt"]) == 4
    val = RLHFDataset(str(mixed_parquet / "val.parquet"), tokenizer, config)
    assert len(val) == 8


def one_sample(tokenizer, row: dict, response: str):
    """One rollout as verl's agent loop hands it to the reward manager."""
    from verl import DataProto

    prompt = tokenizer.encode("question", add_special_tokens=False)
    answer = tokenizer.encode(response, add_special_tokens=False)
    answer.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    ids = torch.tensor([prompt + answer])
    non_tensors = {
        key: np.array([row[key]], dtype=object)
        for key in ("data_source", "reward_model", "extra_info")
    }
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt]),
            "responses": torch.tensor([answer]),
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
        },
        non_tensors=non_tensors,
    )


def test_verls_reward_loop_scores_mixed_rows(compose, tokenizer, mixed_parquet, tmp_path):
    import pyarrow.parquet as pq
    from verl.trainer.ppo.reward import load_reward_manager

    cfg = compose(CONFIG, [f"+reward.custom_reward_function.reward_kwargs.tmp_root={tmp_path}"])
    rows = pq.read_table(mixed_parquet / "val.parquet").to_pylist()[:6]

    async def score(samples):
        manager = load_reward_manager(cfg, tokenizer)
        return [await manager.run_single(sample) for sample in samples]

    references = asyncio.run(
        score([one_sample(tokenizer, row, row["extra_info"]["reference"]) for row in rows])
    )
    for row, out in zip(rows, references):
        assert out["reward_score"] == 1.0, (row["extra_info"], out)
        assert out["reward_extra_info"]["route"] == row["ability"]
    wrong = asyncio.run(
        score(
            [
                one_sample(tokenizer, rows[0], "I think it is \\boxed{12345}"),
                one_sample(tokenizer, rows[1], "```python\nprint('no')\n```"),
                one_sample(tokenizer, rows[1], "```python\nimport os\nos.fork()\n```"),
            ]
        )
    )
    assert [out["reward_score"] for out in wrong] == [0.0, 0.0, 0.0]
    keys = {tuple(out["reward_extra_info"]) for out in references + wrong}
    assert len(keys) == 1  # the same extra-info columns for every sample
    assert list(tmp_path.iterdir()) == []
