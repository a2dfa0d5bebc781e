"""The two generation backends of `entropyrl eval caption` decode alike, whatever the model's
generation_config.json says.

A model folder is given the sampling settings Qwen ships with its instruct models (Qwen2.5-Instruct's
generation_config.json: do_sample, temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05)
and two EOS ids, as Qwen2.5-VL-Instruct's has (<|im_end|>, <|endoftext|>). Then:

- both backends get the same `DecodingSettings`, and its transformers arguments and vLLM
  arguments describe the same decoding (greedy, penalty, token budget, stop ids);
- the transformers backend's answers equal greedy decoding written out by hand with the
  evaluation's penalty, on the caption smoke's warmed-up model, where the model's own penalty
  changes answers (checked), so its config did not leak in;
- what the vLLM backend would send (prompt text, image, sampling parameters) is, request for
  request, what the transformers backend feeds `generate`. vLLM itself needs a GPU: its run is
  not tested here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from entropyrl.commands.eval.generation import check_settings
from entropyrl.commands.eval.models import EvalError, ModelSource
from entropyrl.commands.eval.plan import Plan
from entropyrl.evaluation.generation import (
    REPETITION_PENALTY,
    Request,
    TransformersCaptioner,
    VLLMRequests,
)
from entropyrl.models.images import fetch_image

PROMPT = "Please describe this image in detail."
QWEN_SAMPLING = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
}
IM_END, END_OF_TEXT = "<|im_end|>", "<|endoftext|>"

# The fields of vLLM's `SamplingParams` that a caller sets (the engine's own, such as
# `_all_stop_token_ids`, left out), as vllm/sampling_params.py of vllm-project/vllm declares them
# (read at commit 00388f6573cc; the same names in vLLM 0.8.3's documented signature). vLLM is not
# installed here: this is what keeps a misspelt argument from reaching a GPU machine.
VLLM_SAMPLING_FIELDS = frozenset(
    {
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
        "structured_outputs",
        "logit_bias",
        "allowed_token_ids",
        "extra_args",
        "bad_words",
    }
)

# transformers' GenerationConfig fields that `DecodingSettings.transformers_kwargs` leaves to the
# model, each because it cannot change which token is chosen or where an answer ends.
NOT_DECODING = {
    "bos_token_id": "the prompt of a decoder-only model already holds its start",
    "decoder_start_token_id": "encoder-decoder models only",
    "max_length": "max_new_tokens takes precedence (GenerationMixin._prepare_generated_length)",
    "assistant_confidence_threshold": "assisted decoding only (no assistant, no prompt lookup)",
    "assistant_lookbehind": "assisted decoding only",
    "target_lookbehind": "assisted decoding only",
    "num_assistant_tokens": "assisted decoding only",
    "num_assistant_tokens_schedule": "assisted decoding only",
    "max_matching_ngram_size": "prompt lookup only (prompt_lookup_num_tokens unset)",
    "is_assistant": "assisted decoding only",
    "output_attentions": "what is returned beside the tokens",
    "output_hidden_states": "what is returned beside the tokens",
    "output_logits": "what is returned beside the tokens",
    "output_scores": "what is returned beside the tokens",
    "use_cache": "how the same computation runs",
    "cache_config": "how the same computation runs",
    "cache_implementation": "how the same computation runs",
    "prefill_chunk_size": "how the same computation runs",
    "compile_config": "how the same computation runs",
    "disable_compile": "how the same computation runs",
    "continuous_batching_config": "how the same computation runs",
    "transformers_version": "a label",
}


def plant_generation_config(folder: Path, tokenizer: Any) -> None:
    """Give the model folder Qwen's sampling settings and both of Qwen's EOS ids."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    ids = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    config.update(QWEN_SAMPLING, eos_token_id=ids)
    path.write_text(json.dumps(config, indent=2))


def write_images(folder: Path) -> list[str]:
    """Four noise images of sizes off the 28-pixel grid (fetch_image resizes each)."""
    rng = np.random.default_rng(0)
    paths = []
    for index, (width, height) in enumerate([(112, 112), (150, 90), (60, 200), (230, 170)]):
        path = folder / f"image{index}.png"
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
    return paths


@dataclass(frozen=True)
class TinyFolder:
    model: Path
    images: list[str]
    stops: tuple[int, ...]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> TinyFolder:
    """A random tiny Qwen2.5-VL saved as a checkpoint folder (weights, tokenizer, image
    processor), with Qwen's sampling settings planted."""
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2_5_vl
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    root = tmp_path_factory.mktemp("generation")
    tokenizer = build_qwen_tokenizer(8192)
    processor = build_qwen2vl_processor(tokenizer, image_size=112)
    model = build_tiny_qwen2_5_vl(tokenizer, TinyModelConfig(hidden_size=64), seed=0)
    folder = root / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.image_processor.save_pretrained(folder)
    plant_generation_config(folder, tokenizer)
    stops = tuple(sorted(tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])))
    return TinyFolder(folder, write_images(root), stops)


# --- one decoding, two engines' words for it --------------------------------------------------


def transformers_decoding(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What `model.generate(**kwargs)` does, in words both engines share."""
    filters = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff")
    return {
        "greedy": kwargs["do_sample"] is False
        and kwargs["num_beams"] == 1
        and kwargs["num_return_sequences"] == 1
        and kwargs["penalty_alpha"] is None
        and all(kwargs[name] is None for name in filters),
        "repetition_penalty": kwargs["repetition_penalty"],
        "other_penalties": [
            kwargs[name]
            for name in (
                "no_repeat_ngram_size",
                "bad_words_ids",
                "sequence_bias",
                "suppress_tokens",
            )
            if kwargs[name]
        ],
        "max_new_tokens": kwargs["max_new_tokens"],
        "min_new_tokens": max(kwargs["min_new_tokens"] or 0, kwargs["min_length"] or 0),
        "stop_token_ids": sorted(kwargs["eos_token_id"]),
    }


def vllm_decoding(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What `SamplingParams(**kwargs)` does, in the same words (vLLM: temperature 0 is greedy)."""
    return {
        "greedy": kwargs["temperature"] == 0 and kwargs.get("n", 1) == 1,
        "repetition_penalty": kwargs["repetition_penalty"],
        "other_penalties": [
            kwargs.get(name)
            for name in ("presence_penalty", "frequency_penalty", "bad_words", "logit_bias")
            if kwargs.get(name)
        ],
        "max_new_tokens": kwargs["max_tokens"],
        "min_new_tokens": kwargs.get("min_tokens", 0),
        "stop_token_ids": [] if kwargs.get("ignore_eos") else sorted(kwargs["stop_token_ids"]),
    }


def test_both_backends_decode_alike_whatever_the_models_config(tiny_folder):
    """The model asks for sampling with penalty 1.05; both engines get greedy decoding with the
    evaluation's penalty, the same budget and the same stop ids (the tokenizer's EOS and every
    EOS of generation_config.json)."""
    transformers = TransformersCaptioner(str(tiny_folder.model), device="cpu").decoding
    vllm = VLLMRequests(str(tiny_folder.model)).decoding
    assert transformers == vllm
    expected = {
        "greedy": True,
        "repetition_penalty": REPETITION_PENALTY,
        "other_penalties": [],
        "max_new_tokens": 24,
        "min_new_tokens": 0,
        "stop_token_ids": list(tiny_folder.stops),
    }
    assert transformers_decoding(transformers.transformers_kwargs(24)) == expected
    assert vllm_decoding(vllm.vllm_kwargs(24)) == expected
    assert QWEN_SAMPLING["repetition_penalty"] != REPETITION_PENALTY  # else nothing is shown
    # what was set aside is recorded
    record = transformers.record()
    assert record["replaced_from_generation_config"] == QWEN_SAMPLING
    assert record["strategy"] == "greedy" and record["repetition_penalty"] == REPETITION_PENALTY


def test_every_decoding_field_of_transformers_is_set(tiny_folder):
    """`generate` fills each field a call leaves out from the model's generation_config.json:
    every field that can choose a token or end an answer is given. A field added by a newer
    transformers fails here until it is sorted into one side."""
    from transformers import GenerationConfig

    kwargs = VLLMRequests(str(tiny_folder.model)).decoding.transformers_kwargs(8)
    fields = {name for name in vars(GenerationConfig()) if not name.startswith("_")}
    assert fields - set(kwargs) - set(NOT_DECODING) == set()
    assert set(kwargs) <= fields


def test_the_vllm_arguments_are_sampling_params_fields(tiny_folder):
    kwargs = VLLMRequests(str(tiny_folder.model)).sampling_kwargs(8)
    assert set(kwargs) <= VLLM_SAMPLING_FIELDS
    assert all(isinstance(token, int) for token in kwargs["stop_token_ids"])
    assert kwargs["skip_special_tokens"] is True  # as the transformers backend decodes


def test_a_model_without_generation_config_stops_at_the_tokenizers_eos(tiny_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_folder.model, folder)
    (folder / "generation_config.json").unlink()
    captioner = TransformersCaptioner(str(folder), device="cpu")
    tokenizer = captioner.processor.tokenizer
    decoding = captioner.decoding
    assert decoding.stop_token_ids == (tokenizer.convert_tokens_to_ids(IM_END),)
    assert decoding.pad_token_id == tokenizer.pad_token_id
    assert decoding.model_overrides == ()


# --- the vLLM requests, built on the CPU -------------------------------------------------------


def test_vllm_requests_carry_what_transformers_generates_from(tiny_folder):
    """Prompt text, image pixels and decoding of every request: the vLLM backend's equal the
    transformers backend's. Put through the model's processor (as vLLM's Qwen-VL input
    processing does), the vLLM requests give the very tensors `generate` gets."""
    requests = [
        Request(path, PROMPT if i % 2 else "Is there a dog in the image?")
        for i, path in enumerate(tiny_folder.images)
    ]
    captioner = TransformersCaptioner(str(tiny_folder.model), device="cpu", batch_size=4)
    builder = VLLMRequests(str(tiny_folder.model))
    sent = builder.inputs(requests)
    assert len(sent) == len(requests)
    patch = captioner.processor.image_processor.patch_size
    for request, item in zip(requests, sent):
        assert set(item) == {"prompt", "multi_modal_data"}
        prompt, image = item["prompt"], item["multi_modal_data"]["image"]
        # one image placeholder, which vLLM expands to the image's tokens itself
        assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
        assert prompt.endswith(f"{request.text}{IM_END}\n<|im_start|>assistant\n")
        # the image as training prepared it: RGB, sides on the patch x merge grid
        prepared = fetch_image({"image": request.image}, patch)
        assert image.mode == "RGB" and image.size == prepared.size
        assert image.size[0] % (2 * patch) == 0 and image.size[1] % (2 * patch) == 0
        assert np.array_equal(np.asarray(image), np.asarray(prepared))
    assert any(
        Image.open(r.image).size != i["multi_modal_data"]["image"].size
        for r, i in zip(requests, sent)
    )

    fed = captioner.inputs(requests)
    rebuilt = captioner.processor(
        text=[item["prompt"] for item in sent],
        images=[item["multi_modal_data"]["image"] for item in sent],
        return_tensors="pt",
        padding=True,
    )
    assert set(fed) == set(rebuilt)
    for key in fed:
        assert torch.equal(fed[key], rebuilt[key]), key
    assert vllm_decoding(builder.sampling_kwargs(64)) == transformers_decoding(
        captioner.decoding.transformers_kwargs(64)
    )


# --- what the transformers backend generates ---------------------------------------------------


def greedy_by_hand(
    model: Any, processor: Any, request: Request, *, penalty: float, budget: int, stops: set[int]
) -> str:
    """Greedy decoding written out: the whole sequence through the model at every step, the
    repetition penalty over every token so far (prompt and answer: a positive logit divided by
    it, a negative one multiplied), the top token, until a stop id or `budget` tokens."""
    chat = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": request.text}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    image = fetch_image({"image": request.image}, processor.image_processor.patch_size)
    inputs = dict(processor(text=[chat], images=[image], return_tensors="pt"))
    ids = inputs["input_ids"]
    length = ids.shape[1]
    for _ in range(budget):
        step = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "mm_token_type_ids" in inputs:  # text after the prompt
            step["mm_token_type_ids"] = torch.nn.functional.pad(
                inputs["mm_token_type_ids"], (0, ids.shape[1] - length)
            )
        with torch.no_grad():
            logits = model(**step).logits[0, -1].clone()
        seen = ids[0].unique()
        scores = logits[seen]
        logits[seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
        token = int(logits.argmax())
        if token in stops:
            break
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return processor.decode(ids[0, length:], skip_special_tokens=True).strip()


@pytest.fixture(scope="module")
def captioning_model(smoke_assets, tmp_path_factory) -> tuple[Path, list[str]]:
    """A copy of the caption smoke's warmed-up model with Qwen's sampling settings planted, and
    twelve of its world's images."""
    from transformers import AutoTokenizer

    assets = smoke_assets("caption")
    folder = tmp_path_factory.mktemp("captioner") / "model"
    shutil.copytree(assets / "model", folder)
    plant_generation_config(folder, AutoTokenizer.from_pretrained(folder))
    images = sorted(str(path) for path in (assets / "world" / "val2014").iterdir())[:12]
    return folder, images


def test_transformers_generation_is_greedy_whatever_the_models_config(captioning_model):
    """The backend's answers (batched, left-padded) equal greedy decoding by hand with the
    evaluation's penalty, not with the model's 1.05, which changes some of these answers."""
    folder, images = captioning_model
    requests = [Request(image, PROMPT) for image in images]
    captioner = TransformersCaptioner(str(folder), device="cpu", batch_size=5)
    stops = set(captioner.decoding.stop_token_ids)

    def by_hand(penalty: float) -> list[str]:
        return [
            greedy_by_hand(
                captioner.model, captioner.processor, r, penalty=penalty, budget=24, stops=stops
            )
            for r in requests
        ]

    expected = by_hand(REPETITION_PENALTY)
    assert captioner.generate(requests, 24) == expected
    assert by_hand(QWEN_SAMPLING["repetition_penalty"]) != expected  # the check has power
    assert sum(len(answer.split()) > 3 for answer in expected) >= 3  # captions, not one word


# --- the record beside the generations ---------------------------------------------------------


def plan_for(out: Path) -> Plan:
    return Plan(
        out=out,
        data=out,
        models=[],
        prompt=PROMPT,
        images={},
        chair_ids=[],
        chair_source={},
        caption_sets=[],
        quality_note="",
        pope={},
        pope_source="",
        pope_note="",
        ground_truth="",
        backend="transformers",
        tensor_parallel_size=1,
        max_model_len=8192,
        batch_size=8,
        device="cpu",
        resamples=10,
        seed=0,
        gpus=0,
    )


def test_settings_record_the_backend_and_decoding_and_guard_a_resume(tiny_folder, tmp_path):
    captioner = TransformersCaptioner(str(tiny_folder.model), device="cpu")
    settings = captioner.settings()
    assert settings["backend"] == "transformers"
    assert settings["decoding"] == captioner.decoding.record()
    assert settings["decoding"]["stop_token_ids"] == list(tiny_folder.stops)
    model = ModelSource("base", str(tiny_folder.model), "hf", path=str(tiny_folder.model))
    folder = tmp_path / "base"
    folder.mkdir()
    record = {"model": model.path, "prompt": PROMPT, "backend": "transformers"}
    (folder / "settings.json").write_text(json.dumps({**record, **settings}))
    check_settings(plan_for(tmp_path), model)  # resumable
    # generations made before the decoding was pinned (they said only "greedy") are not
    (folder / "settings.json").write_text(json.dumps({**record, "decoding": "greedy"}))
    with pytest.raises(EvalError, match="decoding"):
        check_settings(plan_for(tmp_path), model)
    other = {**settings["decoding"], "repetition_penalty": 1.05}
    (folder / "settings.json").write_text(json.dumps({**record, "decoding": other}))
    with pytest.raises(EvalError, match="decoding"):
        check_settings(plan_for(tmp_path), model)
