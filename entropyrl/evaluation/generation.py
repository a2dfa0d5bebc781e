"""Greedy answers of a Qwen-VL model to one image and one question each, on two backends.

- `vllm`: vLLM on GPUs, batched over the whole request list, tensor parallel;
- `transformers`: `generate` on the CPU or one GPU, in batches (left padding).

Both build the prompt as verl builds a training prompt: the model's chat template over one user
turn `[image, text]` with the generation prompt, and the image prepared by
`entropyrl.models.images.fetch_image` (the pixels training saw: RGB, sides multiples of patch x
merge, pixel count within the same limits), then the model's own processor. `settings()` records
what a result depends on (backend, pixel limits, template hash) beside the results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from entropyrl.models.images import fetch_image, pixel_limits

__all__ = ["BACKENDS", "Captioner", "Request", "TransformersCaptioner", "VLLMCaptioner", "load"]

BACKENDS = ("vllm", "transformers")


@dataclass(frozen=True)
class Request:
    """One image (a local path) and the text asked about it."""

    image: str
    text: str


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


class TransformersCaptioner:
    """`model.generate` with greedy decoding, `batch_size` requests at a time."""

    def __init__(self, model_path: str, *, device: str | None = None, batch_size: int = 8) -> None:
        import torch

        from entropyrl.models.processor import load_image_only_processor
        from entropyrl.models.tiny import load_model, pick_device

        self.processor = load_image_only_processor(model_path)
        if self.processor is None:
            raise ValueError(f"{model_path}: not a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model")
        self.processor.tokenizer.padding_side = "left"
        self.device = pick_device(device)
        model = load_model(model_path)
        if self.device.type == "cuda":
            model = model.to(torch.bfloat16)
        self.model = model.to(self.device).eval()
        self.batch_size = int(batch_size)
        self.model_path = model_path

    def prompt(self, text: str) -> str:
        return self.processor.apply_chat_template(
            _messages(text), add_generation_prompt=True, tokenize=False
        )

    def generate(self, requests: Sequence[Request], max_new_tokens: int) -> list[str]:
        import torch

        patch = _patch_size(self.processor)
        answers: list[str] = []
        pad = self.processor.tokenizer.pad_token_id
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            inputs = self.processor(
                text=[self.prompt(request.text) for request in batch],
                images=[fetch_image({"image": request.image}, patch) for request in batch],
                return_tensors="pt",
                padding=True,
            ).to(self.device)
            with torch.inference_mode():
                output = self.model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=pad,
                )
            new = output[:, inputs["input_ids"].shape[1] :]
            answers += self.processor.batch_decode(new, skip_special_tokens=True)
        return [answer.strip() for answer in answers]

    def settings(self) -> dict[str, Any]:
        image_processor = self.processor.image_processor
        return {
            "backend": "transformers",
            "device": str(self.device),
            "decoding": "greedy",
            "image_preparation": pixel_limits(_patch_size(self.processor)),
            "processor_pixels": _processor_pixels(image_processor),
            "chat_template_sha256": _template_hash(self.processor.chat_template),
        }


class VLLMCaptioner:
    """vLLM's offline engine: every request of a call in one batch, greedy decoding."""

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
                f"the vllm backend needs vLLM on a GPU machine (pip install 'entropyrl[gpu]'): "
                f"{error}"
            ) from error
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_path)
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

        patch = _patch_size(self.processor)
        inputs = [
            {
                "prompt": self.processor.apply_chat_template(
                    _messages(request.text), add_generation_prompt=True, tokenize=False
                ),
                "multi_modal_data": {"image": fetch_image({"image": request.image}, patch)},
            }
            for request in requests
        ]
        params = SamplingParams(
            temperature=0.0, max_tokens=max_new_tokens, skip_special_tokens=True
        )
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        return [output.outputs[0].text.strip() for output in outputs]

    def settings(self) -> dict[str, Any]:
        import vllm

        image_processor = self.processor.image_processor
        return {
            "backend": "vllm",
            "vllm": vllm.__version__,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "decoding": "greedy",
            "image_preparation": pixel_limits(_patch_size(self.processor)),
            "processor_pixels": _processor_pixels(image_processor),
            "chat_template_sha256": _template_hash(self.processor.chat_template),
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
