"""The core and the local runner on a CUDA GPU in bfloat16, and the recipe's memory per micro-batch.

One script for a GPU machine (no verl, Ray or vLLM needed), each part timed and written to
`--out/cuda_check.json` as soon as it ends, so a part that fails or a run cut short keeps the
others:

- **core**: every advantage estimator, `token_entropy` and `ppo_clip_loss` on the GPU (bf16 and
  float32 inputs) against the same functions on the CPU in float64, the reference; the
  differences and the median time of each side.
- **entropy**: `benchmarks/entropy_memory.py --device cuda` at Qwen's vocabulary (151,936).
- **local**: a `CaptionSession` of the local runner on the GPU with its model in bfloat16:
  warm-up steps and RL steps of `egpo+clip` (CHAIR service over HTTP, CIDEr-D reward), the
  losses finite, seconds per step, peak GPU memory; the same steps in float32 beside them.
- **recipe**: one micro-batch of the captioning recipe through Qwen2.5-VL-3B and -7B built from
  their configs (random bf16 weights, float32 on a CPU; nothing downloaded): 5 sequences of
  1,280 tokens, each with one 640 x 480 image (1,564 patches), gradient checkpointing on,
  log-probs of every position in float32 as verl's actor takes them, the per-sample clip loss,
  backward. Peak GPU memory beside docs/scaling.md's computed activation figures.
- **demo**: `entropyrl demo --device cuda`, the quick start on the GPU in float32, its checks.

    python benchmarks/cuda_check.py --out runs/cuda_check
    python benchmarks/cuda_check.py --small --device cpu --out /tmp/c   # the script's own test
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS: dict[str, Any] = {}


def _save(out: Path) -> None:
    (out / "cuda_check.json").write_text(json.dumps(RESULTS, indent=1, default=str) + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _max_allocated(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _median_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gib(nbytes: float) -> float:
    return round(nbytes / 2**30, 3)


def _gb(nbytes: float) -> float:
    return round(nbytes / 1e9, 3)


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=_gib(props.total_memory),
            cuda=torch.version.cuda,
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return info


# ---------------------------------------------------------------------------------------------
# core: formulas on the device against float64 on the CPU


def _estimator_batch(groups: int, size: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = groups * size
    scores = torch.rand(n, generator=gen)
    scores[:size] = 0.5  # a group of equal rewards
    lengths = torch.randint(1, length + 1, (n,), generator=gen)
    lengths[size] = 0  # an empty response
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    entropy = torch.rand(n, length, generator=gen) * 3.0
    entropy[size + 1] = 0.0  # zero entropy
    return {
        "scores": scores,
        "group": torch.arange(groups).repeat_interleave(size),
        "mask": mask,
        "entropy": entropy,
        "ref": -torch.rand(n, generator=gen) * 50.0,
    }


def _run_estimator(name, batch, specs, where: torch.device, cast: torch.dtype, entropy_dtype):
    from entropyrl.core.algorithms import EstimatorInputs, estimate

    inputs = EstimatorInputs(
        scores=batch["scores"].to(where, cast),
        group=batch["group"].to(where),
        mask=batch["mask"].to(where, cast),
        token_entropy=batch["entropy"].to(entropy_dtype).to(where, cast),
        ref_seq_log_prob=batch["ref"].to(where, cast),
    )
    return estimate(name, inputs, specs)


def core(device: torch.device, small: bool) -> dict[str, Any]:
    from entropyrl.core.algorithms import ESTIMATORS
    from entropyrl.core.clip_schedules import clip_high_bounds
    from entropyrl.core.entropy import token_entropy
    from entropyrl.core.losses import ppo_clip_loss
    from entropyrl.core.specs import AlgorithmSpecs, ClipScheduleSpec

    out: dict[str, Any] = {}
    groups, size, length = (64, 8, 32) if small else (2048, 8, 512)
    batch = _estimator_batch(groups, size, length, seed=0)
    specs = AlgorithmSpecs()
    estimators = {}
    for name in ESTIMATORS:
        row = {}
        for dtype in (torch.float32, torch.bfloat16):
            run = functools.partial(_run_estimator, name, batch, specs)
            reference = run(torch.device("cpu"), torch.float64, dtype)
            got = run(device, torch.float32, dtype)
            diff = (got.token.double().cpu() - reference.token).abs().max().item()
            seconds = _median_seconds(
                functools.partial(run, device, torch.float32, dtype), device, 3 if small else 10
            )
            cpu_seconds = _median_seconds(
                functools.partial(run, torch.device("cpu"), torch.float32, dtype),
                torch.device("cpu"),
                3,
            )
            key = "bf16_entropy" if dtype == torch.bfloat16 else "fp32_entropy"
            row[key] = {
                "max_abs_diff_vs_cpu_fp64": diff,
                "finite": bool(torch.isfinite(got.token).all()),
                "device_seconds": seconds,
                "cpu_fp32_seconds": cpu_seconds,
            }
        estimators[name] = row
    out["estimators"] = {"batch": [groups * size, length], "rows": estimators}

    # token_entropy at the vocabulary of Qwen, bf16 logits as verl's bf16 forward returns them.
    rows = 256 if small else 8192
    gen = torch.Generator(device=device).manual_seed(1)
    logits = torch.randn(rows, 151_936, generator=gen, device=device).mul_(4).to(torch.bfloat16)
    got = token_entropy(logits, chunk_size=1024)
    sample = torch.arange(0, rows, max(1, rows // 256), device=device)
    ref64 = logits[sample].double().cpu()
    reference = -(torch.softmax(ref64, -1) * torch.log_softmax(ref64, -1)).sum(-1)
    out["token_entropy"] = {
        "logits": [rows, 151_936, "bfloat16"],
        "max_abs_diff_vs_cpu_fp64": (got[sample].double().cpu() - reference).abs().max().item(),
        "mean_entropy": got.mean().item(),
        "device_seconds": _median_seconds(
            functools.partial(token_entropy, logits, chunk_size=1024), device, 5
        ),
    }
    del logits

    # The per-sample clip loss and its gradient, float32 on the device vs float64 on the CPU.
    n, t = (64, 32) if small else (4096, 512)
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(n, t, generator=gen) * 3
    new = old + torch.randn(n, t, generator=gen) * 0.3
    adv = torch.randn(n, generator=gen)
    mask = (torch.rand(n, t, generator=gen) > 0.2).float()
    chair = torch.rand(n, generator=gen) * 0.4
    chair[0] = float("nan")  # a sample the service could not score
    schedule = ClipScheduleSpec(enable=True)

    def loss_on(where: torch.device, dtype: torch.dtype):
        log_prob = new.to(where, dtype).requires_grad_(True)
        bounds = clip_high_bounds(chair.to(where, dtype), schedule)
        loss, metrics, _ = ppo_clip_loss(
            log_prob,
            old.to(where, dtype),
            adv.to(where, dtype),
            mask.to(where, dtype),
            clip_high=bounds,
            clip_c=3.0,
        )
        loss.backward()
        return loss.detach(), log_prob.grad, metrics

    ref_loss, ref_grad, ref_metrics = loss_on(torch.device("cpu"), torch.float64)
    dev_loss, dev_grad, dev_metrics = loss_on(device, torch.float32)
    out["ppo_clip_loss"] = {
        "batch": [n, t],
        "loss_abs_diff": abs(dev_loss.item() - ref_loss.item()),
        "grad_max_abs_diff": (dev_grad.double().cpu() - ref_grad).abs().max().item(),
        "clip_frac_high": [dev_metrics.get("clip/frac_high"), ref_metrics.get("clip/frac_high")],
    }
    return out


# ---------------------------------------------------------------------------------------------
# entropy: the existing memory benchmark at Qwen's vocabulary


def entropy(device: torch.device, small: bool) -> dict[str, Any]:
    seq = "64" if small else "2048"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "entropy_memory.py"),
        "--device", device.type, "--vocab", "151936", "--seq", seq, "--naive",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return {"command": " ".join(cmd[1:]), "rc": proc.returncode, "table": proc.stdout.strip(),
            "stderr": proc.stderr.strip()[-2000:]}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# local: the local runner's steps on the device, bf16 and float32


def local(device: torch.device, small: bool, work: Path) -> dict[str, Any]:
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import CaptionSession, MetricsLog, run_rl, run_warmup

    settings = dict(device=str(device), progress=False, steps=2, warmup_cache=False)
    if small:
        settings.update(num_train=40, num_test=8, prompts_per_step=2, samples_per_prompt=4)
    cfg = DemoConfig(**settings)
    rows = {}
    with CaptionSession(cfg, work / "world") as session:
        start_state = session.state()
        for label, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            session.restore(start_state)
            session.model.to(dtype)
            _reset_peak(device)
            log = MetricsLog(work / f"metrics-{label}.jsonl")
            steps = 5 if small else 40
            warm = run_warmup(
                session.model, session.task, cfg, steps=steps, seed=0, log=log, progress=False
            )
            rl = run_rl(session.model, session.task, cfg, "egpo+clip", seed=0, log=log,
                        progress=False)  # fmt: skip
            history = rl["history"]
            keys = ("reward", "chair_i", "cider", "entropy", "clip_high", "loss", "response_length",
                    "clip_frac_high")  # fmt: skip
            rows[label] = {
                "param_dtype": str(next(session.model.parameters()).dtype),
                "warmup_steps": int(warm["steps"]),
                "warmup_seconds_per_step": warm["seconds"] / max(1, warm["steps"]),
                "warmup_loss_last": warm["loss"],
                "rl_steps": len(history),
                "rl_seconds_per_step": rl["seconds"] / max(1, len(history)),
                "rl_last": {k: history[-1].get(k) for k in keys} if history else {},
                "all_finite": all(
                    math.isfinite(v)
                    for h in history
                    for k, v in h.items()
                    if k in ("loss", "entropy", "reward", "clip_high")
                )
                and math.isfinite(warm["loss"]),
                "peak_gib": _gib(_max_allocated(device)) if device.type == "cuda" else None,
            }
            session.model.to(torch.float32)
    return {"config": settings, "rows": rows}


# ---------------------------------------------------------------------------------------------
# recipe: one micro-batch of the captioning recipe through Qwen2.5-VL-3B / -7B (random weights)


def qwen2_5_vl_config(size: str) -> Any:
    """Qwen2.5-VL-{3B,7B}-Instruct's architecture (the values of their published config.json;
    3.755 B and 8.292 B parameters, as docs/scaling.md counts them)."""
    from transformers import Qwen2_5_VLConfig

    text = dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
        max_position_embeddings=128000, rms_norm_eps=1e-6,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    )  # fmt: skip
    vision = dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31], in_chans=3, hidden_act="silu",
    )  # fmt: skip
    if size == "7B":
        text.update(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                    tie_word_embeddings=False)  # fmt: skip
        vision.update(out_hidden_size=3584)
    elif size == "tiny":
        # head dim 128 as in 3B/7B, so the mrope sections still add up
        text.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
        vision.update(depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                      out_hidden_size=256, fullatt_block_indexes=[1])  # fmt: skip
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
        vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=text["tie_word_embeddings"],
    )  # fmt: skip


def _recipe_batch(config: Any, rows: int, length: int, response: int, grid: tuple[int, int],
                  device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:  # fmt: skip
    """`rows` sequences of `length` tokens: text, one image of `grid` patches, text, response."""
    gen = torch.Generator().manual_seed(0)
    h, w = grid
    image_tokens = h * w // 4
    ids = torch.randint(0, 150_000, (rows, length), generator=gen)
    ids[:, 10] = config.vision_start_token_id
    ids[:, 11 : 11 + image_tokens] = config.image_token_id
    ids[:, 11 + image_tokens] = config.vision_end_token_id
    pixels = torch.randn(rows * h * w, 3 * 2 * 14 * 14, generator=gen)
    return {
        "input_ids": ids.to(device),
        "attention_mask": torch.ones(rows, length, dtype=torch.long, device=device),
        "pixel_values": pixels.to(device, dtype),
        "image_grid_thw": torch.tensor([[1, h, w]] * rows, device=device),
        "mm_token_type_ids": (ids == config.image_token_id).long().to(device),
    }


def _recipe_step(model, batch, adv, mask, bounds) -> float:
    """Forward, log-probs of every position in float32 (verl's actor without a fused kernel),
    the per-sample clip loss, backward; returns the loss."""
    from entropyrl.core.losses import ppo_clip_loss

    output = model(**batch, use_cache=False)
    logits = output.logits[:, :-1, :].float()
    ids = batch["input_ids"][:, 1:]
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss, _, _ = ppo_clip_loss(log_prob, log_prob.detach() - 0.01, adv, mask, clip_high=bounds)
    loss.backward()
    return float(loss.detach())


def _drop_grad(parameter: torch.Tensor) -> None:
    parameter.grad = None


def recipe(device: torch.device, small: bool) -> dict[str, Any]:
    from transformers import Qwen2_5_VLForConditionalGeneration

    from entropyrl.core.clip_schedules import clip_high_bounds
    from entropyrl.core.entropy import token_entropy
    from entropyrl.core.specs import ClipScheduleSpec

    # docs/scaling.md: ppo_micro_batch_size_per_gpu 5, max_prompt_length 1,024 + 256 response;
    # a 640 x 480 COCO image becomes 34 x 46 = 1,564 patches (391 image tokens).
    rows, length, response, grid = (2, 160, 32, (8, 8)) if small else (5, 1280, 256, (34, 46))
    sizes = ("tiny",) if small else ("3B", "7B")
    # bf16 as on a GPU; float32 on a CPU, whose bf16 matmuls without AVX512-BF16 run some 100x
    # slower than float32 (torch 2.13: 138 s against 1.4 s for the tiny model's lm_head)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out: dict[str, Any] = {
        "micro_batch": [rows, length],
        "response": response,
        "grid": grid,
        "dtype": str(dtype).removeprefix("torch."),
    }
    for size in sizes:
        row: dict[str, Any] = {}
        out[size] = row
        try:
            config = qwen2_5_vl_config(size)
            config._attn_implementation = "sdpa"
            if device.type == "cuda":
                torch.cuda.empty_cache()
            _reset_peak(device)
            started = time.perf_counter()
            with torch.device(device):
                model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            model.config.use_cache = False
            model.train()
            row["parameters_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 3)
            row["build_seconds"] = round(time.perf_counter() - started, 1)
            batch = _recipe_batch(config, rows, length, response, grid, device, dtype)
            gen = torch.Generator().manual_seed(3)
            chair = (torch.rand(rows, generator=gen) * 0.3).to(device)
            bounds = clip_high_bounds(chair, ClipScheduleSpec(enable=True))
            adv = torch.randn(rows, generator=gen).to(device)
            mask = torch.zeros(rows, length - 1, device=device)
            mask[:, -response:] = 1.0

            step = functools.partial(_recipe_step, model, batch, adv, mask, bounds)
            _sync(device)
            static = _allocated(device)
            _reset_peak(device)
            started = time.perf_counter()
            loss = step()
            _sync(device)
            row["first_step_seconds"] = round(time.perf_counter() - started, 2)
            row["loss_finite"] = math.isfinite(loss)
            grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                        if p.grad is not None)  # fmt: skip
            peak = _max_allocated(device)
            row.update(
                parameters_gb=_gb(static),
                gradients_gb=_gb(grads),
                peak_with_gradients_gb=_gb(peak),
            )
            # Activations alone: each gradient is dropped as soon as it is accumulated, as
            # FSDP2 reduce-scatters it into the sharded float32 gradient (its own row).
            model.zero_grad(set_to_none=True)
            hooks = [p.register_post_accumulate_grad_hook(_drop_grad)
                     for p in model.parameters()]  # fmt: skip
            _reset_peak(device)
            started = time.perf_counter()
            step()
            _sync(device)
            row["second_step_seconds"] = round(time.perf_counter() - started, 2)
            row["activations_gb"] = _gb(_max_allocated(device) - static)
            for hook in hooks:
                hook.remove()
            # The old-log-prob pass: twice the rows, no gradients, log-probs and entropy of
            # every position in float32 (what the estimators read).
            wide = _recipe_batch(config, 2 * rows, length, response, grid, device, dtype)
            _reset_peak(device)
            with torch.no_grad():
                logits = model(**wide, use_cache=False).logits.float()
                log_prob = torch.log_softmax(logits, dim=-1).max(-1).values
                entropy = token_entropy(logits)
            _sync(device)
            row["no_grad_pass_rows"] = 2 * rows
            row["no_grad_pass_gb"] = _gb(_max_allocated(device) - static)
            row["no_grad_finite"] = bool(
                torch.isfinite(log_prob).all() and torch.isfinite(entropy).all()
            )
            del logits, log_prob, entropy, wide
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
        finally:
            model = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------
# demo: the quick start on the device


def demo(device: torch.device, small: bool, work: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "entropyrl", "demo", "--device", device.type, "--no-progress",
           "--out", str(work / "demo")]  # fmt: skip
    if small:
        cmd += ["--warmup-steps", "5", "--steps", "1", "--num-train", "40", "--num-test", "8",
                "--no-warmup-cache"]  # fmt: skip
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as error:
        rc, text = "timeout", (error.stdout or b"").decode() + (error.stderr or b"").decode()
    summary = work / "demo" / "summary.json"
    return {
        "command": " ".join(cmd[1:]),
        "rc": rc,
        "seconds": round(time.perf_counter() - started, 1),
        "tail": text[-3000:],
        "summary": json.loads(summary.read_text()) if summary.exists() else None,
    }


PARTS = ("environment", "core", "local", "recipe", "demo", "entropy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes: the script's own test")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--deadline", type=float, default=1e9,
                        help="seconds from start after which no new part begins")  # fmt: skip
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="cuda-check-"))
    failed = 0
    for part in args.parts.split(","):
        left = args.deadline - (time.perf_counter() - started)
        if left < 20:
            RESULTS[part] = {"skipped": "deadline"}
            continue
        print(f"== {part} (at {time.perf_counter() - started:.0f} s)", flush=True)
        part_started = time.perf_counter()
        try:
            if part == "environment":
                result = environment(device)
            elif part == "core":
                result = core(device, args.small)
            elif part == "entropy":
                result = entropy(device, args.small)
            elif part == "local":
                result = local(device, args.small, work / "local")
            elif part == "recipe":
                result = recipe(device, args.small)
            elif part == "demo":
                result = demo(device, args.small, work, timeout=min(left - 10, 3600))
            else:
                raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")
        except Exception as error:
            failed += 1
            result = {"error": f"{type(error).__name__}: {error}",
                      "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
        result["part_seconds"] = round(time.perf_counter() - part_started, 1)
        RESULTS[part] = result
        _save(out)
        print(json.dumps(result, indent=1, default=str)[:6000], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
