"""Checkpoints on disk: `load_pretrained` (the local runner's `--model PATH`) and `load_model`
(evaluation, LoRA merge, the `hf` rollout) give back the saved weights, float32, no download."""

from __future__ import annotations

import pytest
import torch

from entropyrl.models.loading import load_model, load_pretrained, pick_device


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer(2048)
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(hidden_size=32, num_layers=1), seed=3)
    folder = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    theirs = b.state_dict()
    return all(torch.equal(value, theirs[key]) for key, value in a.state_dict().items())


def test_a_text_checkpoint_loads_with_its_tokenizer(checkpoint):
    folder, saved = checkpoint
    model, tokenizer = load_pretrained(folder, vision=False)
    assert type(model) is type(saved) and same_weights(model, saved)
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.eos_token_id == saved.generation_config.eos_token_id


def test_load_model_picks_the_causal_lm_class_without_a_vision_tower(checkpoint):
    folder, saved = checkpoint
    model = load_model(folder)
    assert type(model) is type(saved) and same_weights(model, saved)


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a local checkpoint folder"):
        load_pretrained(tmp_path / "absent")


def test_pick_device_takes_what_it_is_given():
    assert pick_device("cpu") == torch.device("cpu")
