"""The weight-sync probe on the real `hf` rollout server (in-process, without Ray): the actor's
side fingerprints what a sync sends, the server fingerprints what it generates with, and the
smoke check compares the two. A sync the server ignores is caught although the update is far
too small to show in the rollout's probabilities (a learning-rate-1e-6 step), for full
fine-tuning and for LoRA adapters."""

from __future__ import annotations

import asyncio

import pytest
import torch

from entropyrl.rig import trace
from entropyrl.rig.cpu import hf_rollout
from entropyrl.rig.smoke.check import check_weight_sync

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
# what one AdamW step at lr 1e-6 does to an fp32 weight: every element moves by about lr
NUDGE = 1e-6


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    from entropyrl.rig.smoke.assets import _save_checkpoint
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    folder = tmp_path_factory.mktemp("probe") / "model"
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(hidden_size=64), seed=3)
    _save_checkpoint(model, tokenizer, None, folder)
    return folder


@pytest.fixture
def traced(tmp_path, monkeypatch):
    monkeypatch.setenv(trace.TRACE_ENV, str(tmp_path / "trace"))
    return tmp_path / "trace"


def make_server(compose, checkpoint):
    from omegaconf import OmegaConf

    overrides = [
        f"actor_rollout_ref.model.path={checkpoint}",
        "data.max_prompt_length=64",
        "data.max_response_length=6",
    ]
    config = OmegaConf.create(
        OmegaConf.to_container(compose("chair_mscoco", overrides), resolve=True)
    )
    return hf_rollout.HFRolloutServer(
        config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    )


async def generate(server, tokenizer) -> None:
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    await asyncio.gather(*[server.generate(prompt, dict(PARAMS), f"r{i}") for i in range(3)])


async def sync(server, state, step, peft_config=None, base_sync_done=True):
    """What verl's weight sync does through `HFServerAdapter`: the server loads, the sending
    rank records what it sent."""
    state = {name: tensor.detach().clone() for name, tensor in state.items()}
    await server.update_weights(state, step, peft_config, base_sync_done)
    hf_rollout.trace_weight_sync(0, state, step, peft_config, base_sync_done)


def nudge(tensors) -> None:
    with torch.no_grad():
        for tensor in tensors:
            tensor.add_(NUDGE * torch.sign(torch.randn_like(tensor)))


def ignore_syncs(server) -> None:
    """The planted fault: a rollout that takes no weights after its first sync."""

    async def ignored(*_, **__):
        return None

    server.update_weights = ignored


def probe(folder):
    return check_weight_sync(trace.read(folder, "sync"), trace.read(folder, "rollout"))


@pytest.mark.parametrize("fault", [False, True])
def test_full_weights(compose, checkpoint, tokenizer, traced, fault):
    from entropyrl.models.loading import load_model

    torch.manual_seed(0)
    actor = load_model(str(checkpoint))
    server = make_server(compose, checkpoint)

    async def run():
        await sync(server, actor.state_dict(), 0)
        await generate(server, tokenizer)
        for step in (1, 2):
            nudge(actor.parameters())
            if fault:
                ignore_syncs(server)
            await sync(server, actor.state_dict(), step)
            await generate(server, tokenizer)

    asyncio.run(run())
    problems = probe(traced)
    if fault:
        assert len(problems) == 1 and "other than the actor's last sync" in problems[0]
        assert "trainer step 0" in problems[0]  # it still generates with step 0's weights
    else:
        assert problems == []


@pytest.mark.parametrize("fault", [False, True])
def test_lora_adapters(compose, checkpoint, tokenizer, traced, fault):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from entropyrl.models.loading import load_model

    torch.manual_seed(0)
    actor = get_peft_model(
        load_model(str(checkpoint)), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    config = actor.peft_config["default"].to_dict()
    server = make_server(compose, checkpoint)
    base = {
        name: tensor
        for name, tensor in actor.base_model.model.state_dict().items()
        if ".lora_" not in name
    }

    async def run():
        await sync(server, base, 0, config, base_sync_done=False)  # the base once, as verl does
        await sync(server, get_peft_model_state_dict(actor), 0, config)
        await generate(server, tokenizer)
        for step in (1, 2):
            nudge(p for n, p in actor.named_parameters() if "lora_" in n)
            if fault:
                ignore_syncs(server)
            await sync(server, get_peft_model_state_dict(actor), step, config)
            await generate(server, tokenizer)

    asyncio.run(run())
    problems = probe(traced)
    if fault:
        assert len(problems) == 1 and "other than the actor's last sync" in problems[0]
        assert "lora_" in problems[0]
    else:
        assert problems == []


def test_a_run_whose_weights_never_changed_cannot_be_judged(compose, checkpoint, tokenizer, traced):
    from entropyrl.models.loading import load_model

    actor = load_model(str(checkpoint))
    server = make_server(compose, checkpoint)

    async def run():
        for step in (0, 1):
            await sync(server, actor.state_dict(), step)
            await generate(server, tokenizer)

    asyncio.run(run())
    (problem,) = probe(traced)
    assert problem.startswith("could not judge the weight sync")


def test_without_a_sync_or_probe_rows_it_says_so(traced):
    assert probe(traced) == ["could not judge the weight sync: the rollout wrote no probe rows"]


def test_a_synced_tensor_the_rollout_never_loaded_is_caught():
    """A partial sync: the actor sent an adapter tensor the rollout's weights do not hold at
    all (it loaded the base and dropped the adapter). Hand-made probe rows, no server."""
    sync_rows = [
        {"replica": 0, "kind": "weights", "t": 1.0, "tensors": {"w": "h0"}},
        {"replica": 0, "kind": "adapter", "t": 2.0, "tensors": {"lora_A": "a0", "lora_B": "b0"}},
        {"replica": 0, "kind": "adapter", "t": 4.0, "tensors": {"lora_A": "a1", "lora_B": "b1"}},
    ]
    rollout_rows = [
        {"replica": 0, "t": 3.0, "state": "s0", "step": 1,
         "tensors": {"w": "h0", "lora_A": "a0", "lora_B": "b0"}},
        {"replica": 0, "t": 5.0, "state": "s1", "step": 2, "tensors": {"w": "h0", "lora_A": "a1"}},
    ]  # fmt: skip
    (problem,) = check_weight_sync(sync_rows, rollout_rows)
    assert "trainer step 2" in problem
    assert "1 of 3 tensors differ (1 absent), e.g. lora_B" in problem
    # the same rows with the tensor loaded: nothing to say
    rollout_rows[1]["tensors"]["lora_B"] = "b1"
    assert check_weight_sync(sync_rows, rollout_rows) == []
