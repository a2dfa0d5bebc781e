"""The CPU backend for verl: platform, fixes, processor, Pillow dataset and the `hf` rollout.

Platform selection and the fixes are checked in fresh processes (verl resolves its platform once
per process); the rollout server is driven in this process without Ray, on tiny checkpoints
saved to disk the way the smoke run saves them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

PROBE = r"""
import importlib, json, sys
first = sys.argv[1]
importlib.import_module(first)
import torch
import verl
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend
from verl.workers.config import model as model_config
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
out = {"device": get_device_name()}
out["backend"] = get_nccl_backend()
if out["device"] == "cpu":
    out["device_id"] = get_device_id()
    out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    out["pinned"] = transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory
    out["rollout_adapter"] = get_rollout_class("hf", "async").__name__
    out["rollout_replica"] = RolloutReplicaRegistry.get("hf").__name__
    import os
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    from verl.utils.distributed import initialize_global_process_group_ray
    initialize_global_process_group_ray()
    out["process_group"] = torch.distributed.get_backend()
    torch.distributed.destroy_process_group()
out["processor_patched"] = hasattr(model_config.hf_processor, "__wrapped__")
print(json.dumps(out))
"""


def free_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def probe(first_import: str, platform: str | None) -> dict:
    env = dict(os.environ)
    env.pop("VERL_PLATFORM", None)
    if platform:
        env["VERL_PLATFORM"] = platform
    result = subprocess.run(
        [sys.executable, "-c", PROBE, first_import, free_port()],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "first_import", ["verl", "entropyrl.rig.cpu.hf_rollout", "entropyrl.verl.trainer"]
)
def test_cpu_platform_and_fixes_whatever_is_imported_first(first_import):
    """A Ray actor's first import can be one of our modules (unpickling the rollout server)."""
    report = probe(first_import, "cpu")
    assert report["device"] == "cpu"
    assert report["device_id"] == "cpu"  # used as a device by verl: an int would mean cuda:N
    assert report["backend"] == "gloo"
    assert report["engine"] == "FSDPEngineWithLMHead"
    assert report["pinned"] is False
    assert report["rollout_adapter"] == "HFServerAdapter"
    assert report["rollout_replica"] == "HFRolloutReplica"
    assert report["process_group"] == "gloo"  # verl's default string would be cpu:gloo,cpu:gloo
    if importlib_missing("torchvision"):
        assert report["processor_patched"]


def test_cpu_platform_is_never_picked_without_being_asked():
    report = probe("verl", None)
    assert report["device"] != "cpu"
    assert not report["processor_patched"]


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


# -- checkpoints on disk, as the smoke run writes them -----------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def vl_checkpoint(tmp_path_factory, tokenizer):
    from entropyrl.rig.smoke.assets import _save_checkpoint
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2vl
    from entropyrl.rig.tokenizer import build_qwen2vl_processor

    folder = tmp_path_factory.mktemp("vl") / "model"
    model = build_tiny_qwen2vl(tokenizer, TinyModelConfig(hidden_size=64), seed=1)
    _save_checkpoint(model, tokenizer, build_qwen2vl_processor(tokenizer, image_size=112), folder)
    return folder


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory, tokenizer):
    from entropyrl.rig.smoke.assets import _save_checkpoint
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    folder = tmp_path_factory.mktemp("text") / "model"
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(hidden_size=64), seed=2)
    _save_checkpoint(model, tokenizer, None, folder)
    return folder


@pytest.fixture(scope="module")
def cpu_fixes():
    from entropyrl.rig.cpu import backend as cpu_backend

    cpu_backend.install()


def test_image_only_processor_loads_as_verl_expects(vl_checkpoint, cpu_fixes, tokenizer):
    from verl.workers.config import model as model_config

    processor = model_config.hf_processor(str(vl_checkpoint))
    assert type(processor).__name__ == "Qwen2VLProcessor"  # the name verl's loader matches on
    assert callable(processor.get_rope_index) and processor.config.model_type == "qwen2_vl"
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    inputs = processor(text=[prompt], images=[Image.new("RGB", (112, 112))], return_tensors="pt")
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == pad).sum()) == 16
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]


def test_text_checkpoint_gets_no_processor(text_checkpoint, cpu_fixes):
    from verl.workers.config import model as model_config

    assert model_config.hf_processor(str(text_checkpoint)) is None


# -- the hf rollout server, without Ray -----------------------------------------------------------


def make_server(compose, checkpoint, **rollout):
    from omegaconf import OmegaConf

    from entropyrl.rig.cpu.hf_rollout import HFRolloutServer

    overrides = [
        f"actor_rollout_ref.model.path={checkpoint}",
        "data.max_prompt_length=64",
        "data.max_response_length=12",
        *[f"actor_rollout_ref.rollout.{k}={v}" for k, v in rollout.items()],
    ]
    config = OmegaConf.create(
        OmegaConf.to_container(compose("chair_mscoco", overrides), resolve=True)
    )
    return HFRolloutServer(
        config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, replica_rank=0
    )


def plain_log_probs(model, prompt_ids, response_ids, temperature, **extra) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, **extra).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(
        -1, torch.tensor(response_ids)[:, None]
    )[:, 0]


def test_text_generate_returns_tokens_log_probs_and_step(compose, text_checkpoint, tokenizer):
    server = make_server(compose, text_checkpoint)
    asyncio.run(server.set_global_steps(3))
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")

    async def many():
        return await asyncio.gather(
            *[
                server.generate(
                    prompt,
                    {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True},
                    f"r{i}",
                )
                for i in range(4)
            ]
        )

    outputs = asyncio.run(many())
    for output in outputs:
        assert 1 <= len(output.token_ids) <= 12
        assert len(output.log_probs) == len(output.token_ids)
        assert output.extra_fields["global_steps"] == 3  # verl's metrics need it
        expected = plain_log_probs(server.model, prompt, output.token_ids, 0.7)
        torch.testing.assert_close(torch.tensor(output.log_probs), expected, atol=2e-5, rtol=0)
        vision = {tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>")}
        assert not vision & set(output.token_ids)
    assert server.requests_served == 4


def test_greedy_when_temperature_is_zero(compose, text_checkpoint, tokenizer):
    server = make_server(compose, text_checkpoint)
    prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    params = {"temperature": 0, "top_p": 1.0, "top_k": -1}
    first = asyncio.run(server.generate(prompt, dict(params), "a"))
    second = asyncio.run(server.generate(prompt, dict(params), "b"))
    assert first.token_ids == second.token_ids


def test_image_prompt(compose, vl_checkpoint, cpu_fixes, tokenizer):
    server = make_server(compose, vl_checkpoint)
    processor = server.processor
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    image = Image.new("RGB", (112, 112), (200, 30, 30))
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    prompt = inputs["input_ids"][0].tolist()
    output = asyncio.run(
        server.generate(
            prompt, {"temperature": 1.0, "top_p": 1.0, "top_k": -1}, "img", image_data=[image]
        )
    )
    assert output.token_ids and len(output.log_probs) == len(output.token_ids)
    full = processor(text=[text], images=[image], return_tensors="pt")
    ids = torch.tensor([prompt + output.token_ids])
    with torch.no_grad():
        logits = server.model(
            input_ids=ids,
            pixel_values=full["pixel_values"],
            image_grid_thw=full["image_grid_thw"],
            mm_token_type_ids=torch.cat(
                [
                    full["mm_token_type_ids"],
                    torch.zeros((1, len(output.token_ids)), dtype=torch.long),
                ],
                dim=1,
            ),
        ).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(
        -1, torch.tensor(output.token_ids)[:, None]
    )[:, 0]
    torch.testing.assert_close(torch.tensor(output.log_probs), expected, atol=2e-5, rtol=0)


def test_update_weights_loads_the_trainers_parameters(compose, text_checkpoint):
    server = make_server(compose, text_checkpoint)
    state = {
        name: torch.full_like(value, 0.01) for name, value in server.model.state_dict().items()
    }
    asyncio.run(server.update_weights(state, 5))
    assert server.global_steps == 5
    assert all(torch.all(v == 0.01) for v in server.model.state_dict().values())
    with pytest.raises(RuntimeError, match="do not match"):
        asyncio.run(server.update_weights({"no.such.weight": torch.zeros(1)}, 6))
    partial = dict(list(state.items())[:2])
    with pytest.raises(RuntimeError, match="not sent"):
        asyncio.run(server.update_weights(partial, 6))


def lora_actor(checkpoint, **extra):
    """The actor's LoRA policy as verl's FSDP engine builds it (same LoraConfig keys), with
    non-zero adapters so that they change the outputs."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules="all-linear", bias="none"
    )
    actor = get_peft_model(model, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return actor


def verl_lora_sync(actor):
    """What verl 0.9.1 hands a rollout for a LoRA policy (`get_per_tensor_param` without merge):
    the base weights once, named by `replace_lora_wrapper`, then the adapters."""
    from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper

    peft_config = actor.peft_config["default"]  # the engine hands it on as `to_dict()`
    base = collect_lora_params(actor, layered_summon=False, base_sync_done=False)
    base = {replace_lora_wrapper(name, peft_config): value for name, value in base.items()}
    adapter = collect_lora_params(actor, layered_summon=False, base_sync_done=True)
    return peft_config.to_dict(), base, adapter


def test_update_weights_takes_verls_lora_base_then_adapters(compose, text_checkpoint):
    server = make_server(compose, text_checkpoint)
    actor = lora_actor(text_checkpoint)
    peft_config, base, adapter = verl_lora_sync(actor)
    assert any(".base_layer." in name for name in base)  # the wrapped layers' names
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    asyncio.run(server.update_weights(base, 1, peft_config, False))
    asyncio.run(server.update_weights(adapter, 1, peft_config, True))
    with torch.no_grad():
        expected = actor(input_ids=ids).logits
        torch.testing.assert_close(server.model(input_ids=ids).logits, expected)
    # The next step: new adapters only; the outputs follow them.
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_A" in name:
                param.mul_(-1.0)
    _, _, adapter = verl_lora_sync(actor)
    asyncio.run(server.update_weights(adapter, 2, peft_config, True))
    with torch.no_grad():
        torch.testing.assert_close(server.model(input_ids=ids).logits, actor(input_ids=ids).logits)
    assert server.global_steps == 2
    # A base sync after the adapters (a restarted rollout) loads into the wrapped policy.
    asyncio.run(server.update_weights(base, 3, peft_config, False))
    with torch.no_grad():
        torch.testing.assert_close(server.model(input_ids=ids).logits, actor(input_ids=ids).logits)
    with pytest.raises(RuntimeError, match="do not match"):
        asyncio.run(server.update_weights({"x.lora_A.weight": torch.zeros(1)}, 4, peft_config))
    with pytest.raises(RuntimeError, match="not sent"):
        asyncio.run(server.update_weights(dict(list(adapter.items())[:2]), 4, peft_config))


def test_video_prompts_are_refused(compose, text_checkpoint):
    server = make_server(compose, text_checkpoint)
    with pytest.raises(NotImplementedError, match="text and image"):
        asyncio.run(server.generate([1, 2], {"temperature": 1.0}, "v", video_data=[object()]))


@pytest.fixture(scope="module")
def vl25_checkpoint(tmp_path_factory, tokenizer):
    from entropyrl.rig.smoke.assets import _save_checkpoint
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2_5_vl
    from entropyrl.rig.tokenizer import build_qwen2vl_processor

    folder = tmp_path_factory.mktemp("vl25") / "model"
    model = build_tiny_qwen2_5_vl(tokenizer, TinyModelConfig(hidden_size=64), seed=3)
    _save_checkpoint(model, tokenizer, build_qwen2vl_processor(tokenizer, image_size=112), folder)
    return folder


def test_qwen2_5_vl_processor_is_bound_to_its_own_rope_index(vl25_checkpoint, cpu_fixes):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from verl.workers.config import model as model_config

    processor = model_config.hf_processor(str(vl25_checkpoint))
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert processor.config.model_type == "qwen2_5_vl"
    assert processor.get_rope_index.__func__ is Qwen2_5_VLModel.get_rope_index


def _reference_attention(q, k, v, lengths, causal=True):
    """Plain softmax attention, one sequence at a time ([total, heads, dim] inputs)."""
    out, start = [], 0
    repeat = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = q[start : start + n], k[start : start + n], v[start : start + n]
        ks, vs = ks.repeat_interleave(repeat, 1), vs.repeat_interleave(repeat, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / qs.shape[-1] ** 0.5
        if causal:
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_varlen_attention_keeps_packed_sequences_apart(kv_heads):
    from entropyrl.rig.cpu.backend import varlen_attention

    torch.manual_seed(0)
    lengths = [5, 1, 9, 3]
    total = sum(lengths)
    q, k, v = (
        torch.randn(total, 4, 8),
        torch.randn(total, kv_heads, 8),
        torch.randn(total, kv_heads, 8),
    )
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    got = varlen_attention(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    torch.testing.assert_close(got, _reference_attention(q, k, v, lengths), rtol=1e-5, atol=1e-5)
    # each sequence alone gives the same rows: nothing leaks across the packing
    one = torch.tensor([0, 1], dtype=torch.int32)
    alone = varlen_attention(q[5:6], k[5:6], v[5:6], one, one, 1, 1, causal=True)
    torch.testing.assert_close(got[5:6], alone)


def test_padded_attention_is_causal_within_the_valid_part_of_each_row():
    from entropyrl.rig.cpu.backend import padded_attention

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 6, 4, 8) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])  # right- and left-padded
    got = padded_attention(q, k, v, mask, 6, is_causal=True)
    torch.testing.assert_close(got[0, :4], _reference_attention(q[0, :4], k[0, :4], v[0, :4], [4]))
    torch.testing.assert_close(got[1, 2:], _reference_attention(q[1, 2:], k[1, 2:], v[1, 2:], [4]))
    assert got[0, 4:].abs().sum() == 0 and got[1, :2].abs().sum() == 0
    unmasked = padded_attention(q, k, v, None, 6, is_causal=True)
    torch.testing.assert_close(unmasked[0], _reference_attention(q[0], k[0], v[0], [6]))


def test_verls_remove_padding_attention_runs_on_the_stand_in(cpu_fixes):
    """verl's own `_custom_flash_attention_forward` (the remove-padding path of Qwen2-VL and
    Qwen2.5-VL) on a packed row of three sequences equals attention per sequence."""
    from verl.models.transformers import qwen2_vl

    torch.manual_seed(2)
    lengths = [4, 7, 2]
    total = sum(lengths)
    q, k, v = (torch.randn(1, total, 4, 8) for _ in range(3))
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    got = qwen2_vl._custom_flash_attention_forward(
        q, k, v, None, query_length=total, is_causal=True, position_ids=positions
    )
    expected = _reference_attention(q[0], k[0], v[0], lengths)
    torch.testing.assert_close(got.reshape(total, 4, 8), expected, rtol=1e-5, atol=1e-5)
    single = qwen2_vl._custom_flash_attention_forward(
        q[:, :4],
        k[:, :4],
        v[:, :4],
        None,
        query_length=4,
        is_causal=True,
        position_ids=torch.arange(4).unsqueeze(0),
    )  # one sequence: verl takes transformers' padded path
    torch.testing.assert_close(single.reshape(4, 4, 8), expected[:4], rtol=1e-5, atol=1e-5)
