"""Greedy answers of a Qwen-VL model to one image and one question each, on two backends.

- `vllm`: vLLM on GPUs, batched over the whole request list, tensor parallel;
- `transformers`: `generate` on the CPU or one GPU, in batches (left padding).

Both build the prompt as verl builds a training prompt: the model's chat template over one user
turn `[image, text]` with the generation prompt, and the image prepared by
`entropyrl.models.images.fetch_image` (the pixels training saw: RGB, sides multiples of patch x
merge, pixel count within the same limits), then the model's own processor. Both decode with one
`DecodingSettings`, so their answers differ only by the engines' arithmetic. `settings()` records
what a result depends on (backend, decoding, pixel limits, template hash) beside the results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from entropyrl.models.images import fetch_image, pixel_limits

__all__ = [
    "BACKENDS",
    "DECODING_PROTOCOL",
    "DECODING_TEXT",
    "REPETITION_PENALTY",
    "Captioner",
    "DecodingSettings",
    "Request",
    "TransformersCaptioner",
    "VLLMCaptioner",
    "VLLMRequests",
    "chat_inputs",
    "load",
]

BACKENDS = ("vllm", "transformers")

# No penalty: every model of a comparison is decoded alike, whatever its own
# generation_config.json says (Qwen's instruct models set 1.05; a merged checkpoint has what its
# huggingface/ folder had, a tiny model nothing), and as the policy was trained: verl samples its
# rollouts with repetition_penalty 1.0 (verl.workers.config.rollout.RolloutConfig).
REPETITION_PENALTY = 1.0


@dataclass(frozen=True)
class Request:
    """One image (a local path) and the text asked about it."""

    image: str
    text: str


def _token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


@dataclass(frozen=True)
class DecodingSettings:
    """How the evaluation decodes every answer, the same on both backends: greedy (one beam, no
    sampling), repetition penalty `repetition_penalty` (over the prompt and the answer, as both
    engines apply it), an answer ends at any of `stop_token_ids` or after the call's
    `max_new_tokens`, special tokens are left out of the text. Built once per model by
    `from_model`; nothing of the model's generation_config.json but its EOS ids is used.

    `transformers_kwargs` and `vllm_kwargs` give the two engines' arguments for one token budget
    (the budgets are the protocol's: `entropyrl.commands.eval.plan`)."""

    stop_token_ids: tuple[int, ...]
    pad_token_id: int
    repetition_penalty: float = REPETITION_PENALTY
    skip_special_tokens: bool = True
    # what the model's generation_config.json sets and these settings replace (recorded)
    model_overrides: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_model(cls, model_path: str, tokenizer: Any) -> DecodingSettings:
        """The settings of the model folder `model_path`: stop at the tokenizer's EOS and at every
        `eos_token_id` of its generation_config.json (config.json's without one), the ids vLLM's
        engine stops at by itself; pad with the tokenizer's pad token."""
        from transformers import AutoConfig, GenerationConfig

        try:
            generation = GenerationConfig.from_pretrained(model_path)
            declared = generation.eos_token_id
            own = generation.to_diff_dict()
        except OSError:
            config = AutoConfig.from_pretrained(model_path)
            declared = getattr(config.get_text_config(), "eos_token_id", None)
            own = {}
        stops = sorted({*_token_ids(tokenizer.eos_token_id), *_token_ids(declared)})
        if not stops:
            raise ValueError(f"{model_path}: neither the tokenizer nor the config names an EOS")
        pad = tokenizer.pad_token_id
        settings = cls(
            stop_token_ids=tuple(stops), pad_token_id=int(stops[0] if pad is None else pad)
        )
        overridden = set(settings.transformers_kwargs(1)) - {"eos_token_id", "pad_token_id"}
        return replace(
            settings,
            model_overrides=tuple((key, own[key]) for key in sorted(own) if key in overridden),
        )

    def transformers_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        """`model.generate` arguments. Every field of transformers' GenerationConfig that picks a
        token or ends an answer is given, so no value of the model's generation_config.json
        reaches `generate` (which fills the fields a call leaves out from it); None is
        transformers' "not set"."""
        return {
            "max_new_tokens": int(max_new_tokens),
            "min_new_tokens": None,
            "min_length": 0,
            "max_time": None,
            "stop_strings": None,
            "eos_token_id": list(self.stop_token_ids),
            "pad_token_id": self.pad_token_id,
            "forced_bos_token_id": None,
            "forced_eos_token_id": None,
            # greedy: one beam, no sampling, no other search
            "do_sample": False,
            "num_beams": 1,
            "num_beam_groups": 1,
            "num_return_sequences": 1,
            "penalty_alpha": None,
            "dola_layers": None,
            "prompt_lookup_num_tokens": None,
            "assistant_early_exit": None,
            "guidance_scale": None,
            "low_memory": None,
            "length_penalty": None,
            "early_stopping": None,
            "diversity_penalty": None,
            "constraints": None,
            "force_words_ids": None,
            # the sampling filters (unused when greedy; unset so none warns)
            "temperature": None,
            "top_k": None,
            "top_p": None,
            "min_p": None,
            "top_h": None,
            "typical_p": None,
            "epsilon_cutoff": None,
            "eta_cutoff": None,
            # the logits processors
            "repetition_penalty": self.repetition_penalty,
            "encoder_repetition_penalty": None,
            "no_repeat_ngram_size": None,
            "encoder_no_repeat_ngram_size": None,
            "bad_words_ids": None,
            "sequence_bias": None,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
            "exponential_decay_length_penalty": None,
            "renormalize_logits": False,
            "remove_invalid_values": False,
            "watermarking_config": None,
            "token_healing": False,
            # the output is the token ids, whatever the model's config says
            "return_dict_in_generate": False,
        }

    def vllm_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        """`vllm.SamplingParams(**kwargs)`, in the field names of vLLM's `vllm/sampling_params.py`
        (verl 0.9.1 pins vLLM 0.24). Given SamplingParams, vLLM takes nothing from the model's
        generation_config.json but its EOS ids (`update_from_generation_config`), which
        `stop_token_ids` holds already."""
        return {
            "n": 1,
            "temperature": 0.0,  # greedy: vLLM then also resets top_p, top_k, min_p
            "top_p": 1.0,
            "top_k": -1,  # off: every vLLM takes -1 (newer ones prefer 0)
            "min_p": 0.0,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "max_tokens": int(max_new_tokens),
            "min_tokens": 0,
            "stop": [],
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": False,
            "skip_special_tokens": self.skip_special_tokens,
        }

    def record(self) -> dict[str, Any]:
        """What `settings.json` says of the decoding."""
        return {
            "strategy": "greedy",
            "repetition_penalty": self.repetition_penalty,
            "stop_token_ids": list(self.stop_token_ids),
            "pad_token_id": self.pad_token_id,
            "skip_special_tokens": self.skip_special_tokens,
            "replaced_from_generation_config": dict(self.model_overrides),
        }


# The part of `DecodingSettings.record()` that every model of one evaluation shares, and its words.
DECODING_PROTOCOL = {"strategy": "greedy", "repetition_penalty": REPETITION_PENALTY}
DECODING_TEXT = f"greedy decoding, repetition penalty {REPETITION_PENALTY:g} on both backends"


class Captioner(Protocol):
    def generate(self, requests: Sequence[Request], max_new_tokens: int) -> list[str]: ...

    def settings(self) -> dict[str, Any]: ...


def _messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def _template_hash(template: str | None) -> str | None:
    return hashlib.sha256(template.encode()).hexdigest()[:16] if template else None


def _processor_pixels(image_processor: Any) -> dict[str, Any]:
    """The processor's own pixel bounds (`min_pixels` / `max_pixels`, or `size` in newer
    transformers), applied after `fetch_image`."""
    size = getattr(image_processor, "size", None)
    return {
        "min_pixels": getattr(image_processor, "min_pixels", None),
        "max_pixels": getattr(image_processor, "max_pixels", None),
        "size": {k: v for k, v in dict(size).items() if v is not None} if size else None,
    }


def _patch_size(processor: Any) -> int:
    return int(getattr(processor.image_processor, "patch_size", 14))


def _processor(model_path: str) -> Any:
    """The model's processor (tokenizer, chat template, image processor), the same class on both
    backends so that both write the same prompt."""
    from entropyrl.models.processor import load_image_only_processor

    processor = load_image_only_processor(model_path)
    if processor is None:
        raise ValueError(f"{model_path}: not a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model")
    return processor


def chat_inputs(processor: Any, requests: Sequence[Request]) -> tuple[list[str], list[Any]]:
    """The prompt texts (chat template, generation prompt) and the prepared images of
    `requests`: what either backend hands its engine."""
    patch = _patch_size(processor)
    texts = [
        processor.apply_chat_template(
            _messages(request.text), add_generation_prompt=True, tokenize=False
        )
        for request in requests
    ]
    return texts, [fetch_image({"image": request.image}, patch) for request in requests]


def _settings(processor: Any, decoding: DecodingSettings) -> dict[str, Any]:
    return {
        "decoding": decoding.record(),
        "image_preparation": pixel_limits(_patch_size(processor)),
        "processor_pixels": _processor_pixels(processor.image_processor),
        "chat_template_sha256": _template_hash(processor.chat_template),
    }


class TransformersCaptioner:
    """`model.generate` with `DecodingSettings`, `batch_size` requests at a time."""

    def __init__(self, model_path: str, *, device: str | None = None, batch_size: int = 8) -> None:
        import torch

        from entropyrl.models.loading import load_model, pick_device

        self.processor = _processor(model_path)
        self.processor.tokenizer.padding_side = "left"
        self.decoding = DecodingSettings.from_model(model_path, self.processor.tokenizer)
        self.device = pick_device(device)
        model = load_model(model_path)
        if self.device.type == "cuda":
            model = model.to(torch.bfloat16)
        self.model = model.to(self.device).eval()
        self.batch_size = int(batch_size)
        self.model_path = model_path

    def inputs(self, requests: Sequence[Request]) -> Any:
        """The model inputs of one batch (left-padded), on the model's device."""
        texts, images = chat_inputs(self.processor, requests)
        return self.processor(text=texts, images=images, return_tensors="pt", padding=True).to(
            self.device
        )

    def generate(self, requests: Sequence[Request], max_new_tokens: int) -> list[str]:
        import torch

        answers: list[str] = []
        kwargs = self.decoding.transformers_kwargs(max_new_tokens)
        for start in range(0, len(requests), self.batch_size):
            inputs = self.inputs(requests[start : start + self.batch_size])
            with torch.inference_mode():
                output = self.model.generate(**inputs, **kwargs)
            new = output[:, inputs["input_ids"].shape[1] :]
            answers += self.processor.batch_decode(
                new, skip_special_tokens=self.decoding.skip_special_tokens
            )
        return [answer.strip() for answer in answers]

    def settings(self) -> dict[str, Any]:
        return {
            "backend": "transformers",
            "device": str(self.device),
            **_settings(self.processor, self.decoding),
        }


class VLLMRequests:
    """What the vLLM backend sends its engine, built without vLLM (so it is tested on the CPU
    against the transformers backend's inputs): per request the prompt text and the prepared
    image (`multi_modal_data`), which vLLM's processor turns into tokens and pixels, and the
    sampling parameters."""

    def __init__(self, model_path: str) -> None:
        self.processor = _processor(model_path)
        self.decoding = DecodingSettings.from_model(model_path, self.processor.tokenizer)

    def inputs(self, requests: Sequence[Request]) -> list[dict[str, Any]]:
        texts, images = chat_inputs(self.processor, requests)
        return [
            {"prompt": text, "multi_modal_data": {"image": image}}
            for text, image in zip(texts, images)
        ]

    def sampling_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        return self.decoding.vllm_kwargs(max_new_tokens)


class VLLMCaptioner:
    """vLLM's offline engine: every request of a call in one batch, `DecodingSettings`."""

    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = 8192,
        gpu_memory_utilization: float = 0.8,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as error:
            raise RuntimeError(
                "the vllm backend needs vLLM on a GPU machine: `entropyrl doctor` names the "
                "install route for its NVIDIA driver (docs/install.md#gpu-nodes), or "
                f"--backend transformers runs without it: {error}"
            ) from error

        self.requests = VLLMRequests(model_path)
        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            limit_mm_per_prompt={"image": 1},
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len

    def generate(self, requests: Sequence[Request], max_new_tokens: int) -> list[str]:
        from vllm import SamplingParams

        params = SamplingParams(**self.requests.sampling_kwargs(max_new_tokens))
        outputs = self.llm.generate(self.requests.inputs(requests), params, use_tqdm=False)
        return [output.outputs[0].text.strip() for output in outputs]

    def settings(self) -> dict[str, Any]:
        import vllm

        return {
            "backend": "vllm",
            "vllm": vllm.__version__,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            **_settings(self.requests.processor, self.requests.decoding),
        }


def load(
    backend: str,
    model_path: str,
    *,
    tensor_parallel_size: int = 1,
    batch_size: int = 8,
    device: str | None = None,
    max_model_len: int | None = 8192,
) -> Captioner:
    """The captioner of `backend` ("vllm" or "transformers") for a local model folder.
    `max_model_len` bounds vLLM's context (prompt with the image's tokens + answer), so the KV
    cache is sized for captions, not for the model's full context."""
    if backend == "vllm":
        return VLLMCaptioner(
            model_path, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len
        )
    if backend == "transformers":
        return TransformersCaptioner(model_path, device=device, batch_size=batch_size)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
