"""`actor_rollout_ref.rollout.name=hf`: a transformers `generate` rollout server for verl 0.9.1.

verl's v1 trainer only generates through rollout servers (vLLM, SGLang, TensorRT-LLM), none of
which runs on a CPU. This rollout keeps verl's server protocol and swaps the engine for
transformers:

- `HFRolloutServer` (a Ray actor, one per replica) loads the policy from the model path and
  answers verl's token-in/token-out `generate` (tokens, log-probs of the sampled tokens at the
  sampling temperature, `extra_fields["global_steps"]`), for text and Qwen2-VL image prompts.
  Concurrent requests are decoded together in small batches.
- `HFRolloutReplica` launches that server for verl's `LLMServerManager` (hybrid mode: it shares
  the node with the actor workers and owns no accelerator).
- `HFServerAdapter` is the rollout object inside each actor worker: on verl's weight sync it
  gathers the full parameters (every rank iterates the generator, the gather is collective) and
  the replica's first rank sends them to its server.

It is meant for CPU smoke runs and tests of the real trainer, not for throughput: GPU users keep
vLLM.

Reproducible rollouts: by default concurrent requests are decoded together and draw from one
random stream, so which responses come out depends on arrival order. With verl's own
`actor_rollout_ref.rollout.full_determinism=true` each request is decoded alone with a seed made
from `rollout.seed`, its prompt (token ids and image pixels) and how many identical requests
this replica served before it: the same data and weights give the same responses in every run
of one replica. Two layouts (1 rank against 2) still sample differently, as requests spread over
several replicas by load; to train both on the same batch, record and replay it. With
`ENTROPYRL_ROLLOUT_RECORD=FILE` every served response is appended to FILE (one JSON line: prompt
key, the trainer step of the weights that sampled it, token ids, log-probs); with `ENTROPYRL_ROLLOUT_REPLAY=FILE` nothing is sampled and each
request gets the next recorded response for its prompt (prompt token ids plus image pixels), in
recorded order. The queue of recorded responses lives in one named Ray actor that every replica
asks, so the n requests of a prompt get the n recorded responses whichever replicas serve them.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
import time
from collections import defaultdict, deque
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from entropyrl.core.files import json_dumps
from entropyrl.rig import trace

logger = logging.getLogger(__name__)


_SERVER_PREFIX = "hf_server_"
# Tokens a policy must never emit: a sampled vision placeholder breaks the actor's next forward
# ("image features and image tokens do not match"). vLLM has no such guard; a trained Qwen-VL
# never samples these, a small policy early in training can.
_FORBIDDEN_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


RECORD_ENV = "ENTROPYRL_ROLLOUT_RECORD"
REPLAY_ENV = "ENTROPYRL_ROLLOUT_REPLAY"
_REPLAY_ACTOR = "hf_rollout_replay"


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    return f"{_SERVER_PREFIX}{replica_rank}_{node_rank}"


def prompt_key(prompt_ids: Sequence[int], images: Sequence[Any] | None = None) -> str:
    """What identifies a request's prompt across runs: its token ids and its images' pixels.

    The token ids alone are not enough: every caption prompt of a data set has the same text and
    the same number of image placeholder tokens.
    """
    digest = hashlib.sha1(",".join(str(int(token)) for token in prompt_ids).encode())
    for image in images or ():
        digest.update(f"|{image.mode}:{image.size}|".encode())
        digest.update(image.tobytes())
    return digest.hexdigest()


def read_recording(path: str | Path) -> dict[str, list[tuple[list[int], list[float]]]]:
    """Recorded responses by prompt key, in recorded order (`ENTROPYRL_ROLLOUT_RECORD` lines)."""
    by_prompt: dict[str, list[tuple[list[int], list[float]]]] = defaultdict(list)
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            by_prompt[row["prompt"]].append((list(row["token_ids"]), list(row["log_probs"])))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a recorded rollout line ({error})") from error
    return dict(by_prompt)


class ReplayStore:
    """The recorded responses, handed out once each, in recorded order, to any replica that asks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.queues = {key: deque(answers) for key, answers in read_recording(path).items()}

    def take(self, key: str) -> tuple[list[int], list[float]] | None:
        queue = self.queues.get(key)
        return queue.popleft() if queue else None

    def left(self) -> int:
        return sum(len(queue) for queue in self.queues.values())


def _replay_store(path: str) -> Any:
    """The run's one `ReplayStore` actor (the first replica to ask creates it)."""
    return (
        ray.remote(ReplayStore)
        .options(name=_REPLAY_ACTOR, get_if_exists=True, num_cpus=0)
        .remote(path)
    )


def _append_line(path: str, row: dict[str, Any]) -> None:
    """One JSON line, written with a single append (replicas may share the file)."""
    data = (json_dumps(row) + "\n").encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, data)
    finally:
        os.close(descriptor)


def _load_policy(path: str, trust_remote_code: bool) -> Any:
    """The policy from a local checkpoint folder, float32 on the CPU, eval mode."""
    from entropyrl.models.loading import load_model

    model = load_model(path, trust_remote_code=trust_remote_code, attn_implementation="sdpa")
    model.eval()
    return model


def _sampling_kwargs(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """transformers `generate` arguments for verl's sampling params (vLLM conventions)."""
    temperature = float(sampling_params.get("temperature", 1.0))
    top_p = float(sampling_params.get("top_p", 1.0))
    top_k = int(sampling_params.get("top_k", -1))
    if temperature <= 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k if top_k > 0 else 0,
    }


def _copy_into(
    own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> tuple[list[str], list[str]]:
    """Copy `state` into the policy's tensors `own` (by name, in their dtype); returns the
    policy's names `state` lacks (a tied `lm_head` aside) and the names it has no place for."""
    unexpected = [name for name in state if name not in own]
    tied = {name for name in own if name.endswith("lm_head.weight")}
    missing = [name for name in own if name not in state and name not in tied]
    with torch.no_grad():
        for name, tensor in state.items():
            if name in own:
                own[name].copy_(tensor.to(own[name].dtype))
    return missing, unexpected


class HFRolloutServer:
    """verl's rollout-server protocol answered by transformers `generate` (one process)."""

    def __init__(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: Any = None,
        workers: Sequence[Any] = (),
        replica_rank: int = 0,
        node_rank: int = 0,
        **_: Any,
    ) -> None:
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config)
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.rollout_mode = rollout_mode
        self.global_steps: int | None = None
        # Sampling repeats for a given seed (verl seeds its own workers; this actor is ours).
        torch.manual_seed(int(getattr(self.config, "seed", 0) or 0) + replica_rank)
        threads = int(os.environ.get("ENTROPYRL_ROLLOUT_THREADS", "0") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        self.model = _load_policy(self.model_config.local_path, self.model_config.trust_remote_code)
        self.adapter_config: Any = None  # the trainer's LoRA config once adapters arrive
        self.tokenizer = self.model_config.tokenizer
        self.processor = self.model_config.processor
        generation = self.model.generation_config
        eos = generation.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else (eos[0] if eos else 0)
        )
        vocab = self.tokenizer.get_vocab()
        self.forbidden_ids = sorted({vocab[token] for token in _FORBIDDEN_TOKENS if token in vocab})
        self.image_token_id = vocab.get("<|image_pad|>")
        self.max_batch = max(1, int(os.environ.get("ENTROPYRL_ROLLOUT_BATCH", "16")))
        self.deterministic = bool(getattr(self.config, "full_determinism", False))
        self._occurrences: dict[str, int] = defaultdict(int)
        self._queue: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.requests_served = 0
        self._weights_key: tuple | None = None  # (name, storage, version) of every tensor
        self._weights_state: str | None = None
        self._replay_traced = False
        self.record_path = os.environ.get(RECORD_ENV) or None
        replay = os.environ.get(REPLAY_ENV) or None
        self.replay_path = replay
        self._replay = _replay_store(replay) if replay else None

    # -- verl's server protocol -------------------------------------------------------------

    def get_server_address(self) -> tuple[str, int]:
        # No HTTP endpoint: verl's token-in/token-out path calls `generate` on the actor handle.
        return ray.util.get_node_ip_address().strip("[]"), 0

    def get_master_address(self) -> tuple[None, None, None]:
        return None, None, None

    async def launch_server(self, **_: Any) -> None:
        return None

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        **_: Any,
    ) -> TokenOutput:
        """Sample one response for `prompt_ids` (images as PIL, as verl's agent loop passes them)."""
        del request_id, priority, mm_processor_kwargs
        if video_data is not None or audio_data is not None:
            raise NotImplementedError("the hf rollout handles text and image prompts only")
        prompt_ids = [int(token) for token in prompt_ids]
        params = dict(sampling_params)
        max_possible = int(self.config.max_model_len or 10**9) - len(prompt_ids)
        if "max_tokens" in params:
            max_tokens = int(params.pop("max_tokens"))
        elif "max_new_tokens" in params:
            max_tokens = int(params.pop("max_new_tokens"))
        else:
            max_tokens = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - len(prompt_ids),
            )
        max_tokens = max(1, min(max_tokens, max_possible))
        images = list(image_data) if image_data else None
        replaying = self._replay is not None
        keyed = replaying or self.record_path or self.deterministic
        key = prompt_key(prompt_ids, images) if keyed else ""
        if replaying:
            if trace.trace_dir() is not None and not self._replay_traced:
                self._replay_traced = True
                trace.write(
                    f"rollout-{self.replica_rank}-{os.getpid()}",
                    [{"t": time.time(), "replica": self.replica_rank, "replay": True}],
                )
            answer = await self._replay.take.remote(key)
            if answer is None:
                raise RuntimeError(
                    f"hf rollout replay: {self.replay_path} has no response left for prompt {key} "
                    "(replay the run that recorded it, with the same data and settings)"
                )
            token_ids, log_probs = answer
            self.requests_served += 1
            return TokenOutput(
                token_ids=token_ids,
                log_probs=log_probs,
                stop_reason="completed",
                extra_fields={"global_steps": self.global_steps},
            )
        request = {
            "prompt_ids": prompt_ids,
            "images": images,
            "max_tokens": max_tokens,
            "sampling": _sampling_kwargs(params),
            "temperature": float(params.get("temperature", 1.0)),
            "seed": self._request_seed(key) if self.deterministic else None,
        }
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append((request, future))
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        self._wakeup.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._serve())
        token_ids, log_probs = await future
        self.requests_served += 1
        if self.record_path:
            row = {"prompt": key, "step": self.global_steps, "token_ids": token_ids}
            _append_line(self.record_path, {**row, "log_probs": log_probs})
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def _request_seed(self, key: str) -> int:
        """The sampling seed of a request: rollout seed, prompt, and its rank among identical
        requests on this replica (identical requests are interchangeable, so arrival order
        does not change the set of responses)."""
        occurrence = self._occurrences[key]
        self._occurrences[key] += 1
        seed = int(getattr(self.config, "seed", 0) or 0)
        digest = hashlib.sha1(f"{seed}:{key}:{occurrence}".encode()).hexdigest()
        return int(digest[:15], 16)

    async def _serve(self) -> None:
        """Decode queued requests in batches of equal sampling settings, one batch at a time."""
        assert self._wakeup is not None
        while True:
            if not self._queue:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=5.0)
                except asyncio.TimeoutError:
                    if not self._queue:
                        return
                continue
            # Let concurrent submissions of the same step arrive before decoding.
            await asyncio.sleep(0.01)
            batch = self._take_batch()
            try:
                async with self._lock:
                    results = await asyncio.to_thread(self._decode, [r for r, _ in batch])
            except Exception as error:  # every waiter gets the error, none hangs
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    def _take_batch(self) -> list[tuple[dict[str, Any], asyncio.Future]]:
        first, _ = self._queue[0]
        key = (repr(first["sampling"]), first["max_tokens"], first["images"] is None)
        batch, rest = [], []
        for item in self._queue:
            request = item[0]
            same = (
                repr(request["sampling"]),
                request["max_tokens"],
                request["images"] is None,
            ) == key
            limit = 1 if self.deterministic else self.max_batch
            if same and len(batch) < limit:
                batch.append(item)
            else:
                rest.append(item)
        self._queue = rest
        return batch

    def _weights_in_use(self) -> dict[str, torch.Tensor]:
        """Every tensor the policy generates with, under the names a weight sync sends: the
        model's own state-dict names, and with LoRA also the adapters' peft names."""
        tensors = dict(self.model.state_dict())
        if self.adapter_config is not None:
            from peft import get_peft_model_state_dict

            tensors.update(get_peft_model_state_dict(self.model))
        return tensors

    def _trace_weights(self, requests: int) -> None:
        """The weight-sync probe's rollout side (`entropyrl.rig.trace`): one row per generate
        call with the digest of the weights in use, their fingerprints whenever they changed
        (a tensor's in-place version counter tells, without hashing every call)."""
        tensors = self._weights_in_use()
        key = tuple((name, t.data_ptr(), t._version) for name, t in sorted(tensors.items()))
        row: dict[str, Any] = {"t": time.time(), "replica": self.replica_rank}
        row.update(step=self.global_steps, requests=requests)
        if key != self._weights_key:
            fingerprints = trace.tensor_fingerprints(tensors.items())
            self._weights_key, self._weights_state = key, trace.state_digest(fingerprints)
            row["tensors"] = fingerprints
        row["state"] = self._weights_state
        trace.write(f"rollout-{self.replica_rank}-{os.getpid()}", [row])

    @torch.no_grad()
    def _decode(self, requests: list[dict[str, Any]]) -> list[tuple[list[int], list[float]]]:
        """Left-padded batched `generate`; log-probs of the sampled tokens at the temperature."""
        if trace.trace_dir() is not None:
            self._trace_weights(len(requests))
        lengths = [len(r["prompt_ids"]) for r in requests]
        width = max(lengths)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            ids = torch.tensor(request["prompt_ids"], dtype=torch.long)
            input_ids[row, width - len(ids) :] = ids
            attention[row, width - len(ids) :] = 1
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention}
        images = [image for r in requests for image in (r["images"] or [])]
        if images:
            inputs.update(self._image_inputs(images, input_ids))
        else:
            # Text models read positions from here; left padding must not shift them.
            inputs["position_ids"] = (attention.cumsum(dim=1) - 1).clamp_min(0)
        first = requests[0]
        with torch.random.fork_rng(devices=[], enabled=first["seed"] is not None):
            if first["seed"] is not None:  # full determinism: one request, its own seed
                torch.manual_seed(first["seed"])
            output = self.model.generate(
                **inputs,
                max_new_tokens=first["max_tokens"],
                eos_token_id=self.eos_ids or None,
                pad_token_id=self.pad_id,
                suppress_tokens=self.forbidden_ids or None,
                return_dict_in_generate=True,
                output_logits=True,
                use_cache=True,
                **first["sampling"],
            )
        sequences = output.sequences[:, width:]
        temperature = first["temperature"] if first["temperature"] > 0 else 1.0
        logits = torch.stack(output.logits, dim=1).float() / temperature
        log_probs = (
            torch.log_softmax(logits, dim=-1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)
        )
        results = []
        for row in range(len(requests)):
            tokens = sequences[row].tolist()
            end = len(tokens)
            for position, token in enumerate(tokens):
                if token in self.eos_ids:
                    end = position + 1  # the end-of-turn token is part of the response, as in vLLM
                    break
            results.append((tokens[:end], log_probs[row, :end].tolist()))
        return results

    def _image_inputs(self, images: list[Any], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.processor is None or getattr(self.processor, "image_processor", None) is None:
            raise ValueError("image prompts need the model's processor (none was loaded)")
        features = self.processor.image_processor(images=images, return_tensors="pt")
        extra = {
            "pixel_values": features["pixel_values"],
            "image_grid_thw": features["image_grid_thw"],
        }
        if self.image_token_id is not None:
            extra["mm_token_type_ids"] = (input_ids == self.image_token_id).long()
        return extra

    async def update_weights(
        self,
        state: dict[str, torch.Tensor],
        global_steps: int | None,
        peft_config: Any = None,
        base_sync_done: bool = True,
    ) -> None:
        """Load what verl's weight sync hands a rollout: the full parameters (full fine-tuning,
        or LoRA with `model.lora.merge=true`), or with LoRA adapters (`peft_config`) first the
        base weights (`base_sync_done=False`, LoRA-wrapped layers named `...base_layer.weight`)
        and then, every step, the adapter weights alone."""
        async with self._lock:
            if peft_config is None:
                missing, unexpected = await asyncio.to_thread(self._load_state, state)
            elif not base_sync_done:
                missing, unexpected = await asyncio.to_thread(self._load_lora_base, state)
            else:
                missing, unexpected = await asyncio.to_thread(
                    self._load_lora_adapter, state, peft_config
                )
        if unexpected:
            raise RuntimeError(
                f"hf rollout: {len(unexpected)} weights do not match the policy, e.g. {unexpected[:5]}"
            )
        if missing:
            raise RuntimeError(
                f"hf rollout: {len(missing)} policy weights were not sent, e.g. {missing[:5]}"
            )
        if global_steps is not None:
            self.global_steps = global_steps

    def _load_state(self, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
        return _copy_into(self.model.state_dict(), state)

    def _load_lora_base(self, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
        """The base weights of a LoRA policy. Before the first adapter the policy here is the
        plain model (drop `base_layer` from the names); after it, the names are the wrapped
        model's own."""
        if self.adapter_config is None:
            return self._load_state(
                {name.replace(".base_layer.", "."): t for name, t in state.items()}
            )
        base = self.model.get_base_model()
        return _copy_into(
            {name: t for name, t in base.state_dict().items() if ".lora_" not in name}, state
        )

    def _load_lora_adapter(
        self, state: dict[str, torch.Tensor], peft_config: Any
    ) -> tuple[list[str], list[str]]:
        """The adapter weights (names as peft's `get_peft_model_state_dict` gives them), loaded
        into the policy wrapped by peft with the trainer's own LoRA config on first use."""
        from peft import (
            PeftConfig,
            get_peft_model,
            get_peft_model_state_dict,
            set_peft_model_state_dict,
        )

        if self.adapter_config is None:
            # verl's engine hands its LoraConfig as `to_dict()`; a config object works too.
            if isinstance(peft_config, dict):
                config = PeftConfig.from_peft_type(**peft_config)
            else:
                config = copy.deepcopy(peft_config)
            config.inference_mode = True
            self.model = get_peft_model(self.model, config)
            self.model.eval()
            self.adapter_config = config
        expected = set(get_peft_model_state_dict(self.model))
        unexpected = sorted(set(state) - expected)
        missing = sorted(expected - set(state))
        if not unexpected and not missing:
            dtype = next(self.model.parameters()).dtype
            with torch.no_grad():
                set_peft_model_state_dict(self.model, {k: t.to(dtype) for k, t in state.items()})
        return missing, unexpected

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        while self._queue or self._lock.locked():
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, **_: Any) -> dict[str, Any]:
        # Sync training never aborts; requests in flight finish (they are short on a CPU).
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, **_: Any) -> dict[str, Any]:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    async def resume_engine_generation(self) -> None:
        return None

    async def open_submission_gate(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"requests_served": self.requests_served, "global_steps": self.global_steps}


class HFRolloutReplica(RolloutReplica):
    """One `HFRolloutServer` per replica, beside the replica's actor workers."""

    async def launch_servers(self) -> None:
        if not self.workers:
            raise RuntimeError("the hf rollout runs in hybrid mode only (beside the actor workers)")
        node_ids = await asyncio.gather(
            *[
                worker.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                for worker in self.workers[:1]
            ]
        )
        server = (
            ray.remote(HFRolloutServer)
            .options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_ids[0], soft=False
                ),
                name=server_name(self.replica_rank),
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                workers=self.workers,
                replica_rank=self.replica_rank,
                node_rank=0,
            )
        )
        self.servers = [server]
        address, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"{address}:{port}"


def trace_weight_sync(
    replica: int,
    state: dict[str, torch.Tensor],
    global_steps: int | None,
    peft_config: Any,
    base_sync_done: bool,
) -> None:
    """The weight-sync probe's actor side (`entropyrl.rig.trace`): the fingerprint of every
    tensor one sync handed replica `replica`'s server, written once the server has loaded them.
    Kinds: `weights` (full parameters), `adapter` (LoRA adapters, every step) and `lora_base`
    (LoRA's base weights, once, under names the server maps; not compared)."""
    if trace.trace_dir() is None:
        return
    kind = "weights" if peft_config is None else "adapter"
    if peft_config is not None and not base_sync_done:
        kind = "lora_base"
    row = {"t": time.time(), "replica": replica, "kind": kind, "step": global_steps}
    row["tensors"] = trace.tensor_fingerprints(state.items())
    trace.write(f"sync-{replica}-{os.getpid()}", [row])


class HFServerAdapter(BaseRollout):
    """The rollout object inside each actor worker: forwards weight syncs to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config: Any = None,
        base_sync_done: bool = True,
        **_: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes full tensors, not {wire_format!r}")
        sender = self.rollout_rank == 0
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:  # every rank iterates: the full-tensor gather is collective
            if sender:
                state[name] = tensor.detach().to("cpu", copy=True)
        if sender:
            await self._server_handle().update_weights.remote(
                state, global_steps, peft_config, base_sync_done
            )
            trace_weight_sync(self.replica_rank, state, global_steps, peft_config, base_sync_done)
