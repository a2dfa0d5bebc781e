"""Which images a hallucination evaluation uses, chosen so every model sees the same ones and none
was trained on.

CHAIR's protocol (Rohrbach et al. 2018; OPERA, VCD and most later papers) captions 500 COCO
val2014 images. Papers draw them at random, and OPERA's seed does not even fix its set (it
shuffles a directory listing, whose order the file system decides). Here the set is a function of
its inputs: the held-out images that `entropyrl prepare coco` wrote to `test.parquet` (val2014
images in neither the training nor the validation split), sorted by id, then
`random.Random(seed).sample` of `n`; or a given list (a paper's released file). Either way the
list is written beside the results.

`entropyrl prepare coco` trains on no val2014 image unless `--restval` (Karpathy's split puts
30,504 val2014 images, "restval", into training), so a val2014 list from a paper can hold training
images only then: `check_held_out` refuses a list with any image of the training split, in one
line naming how many and which.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.data.io import InputFileError

__all__ = [
    "DEFAULT_NUM_IMAGES",
    "DEFAULT_SEED",
    "EvalImage",
    "ProtocolError",
    "check_held_out",
    "read_split",
    "sample_image_ids",
]

DEFAULT_NUM_IMAGES = 500
DEFAULT_SEED = 0


class ProtocolError(ValueError):
    """An image set that breaks the protocol (overlaps training, unknown images); one line."""


@dataclass(frozen=True)
class EvalImage:
    """One image of a prepared split: its id, file, references and the split's prompt."""

    image_id: int
    path: str
    references: tuple[str, ...]
    prompt: str
    source: str


def _prompt_text(prompt: Any) -> str:
    """The user turn of a prepared row without its `<image>` placeholder."""
    messages = list(prompt) if prompt is not None else []
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    if len(users) != 1 or not isinstance(users[0].get("content"), str):
        raise InputFileError("a row's prompt must hold one user turn with text content")
    return users[0]["content"].replace("<image>", "").strip()


def read_split(path: str | os.PathLike[str]) -> dict[int, EvalImage]:
    """`{image_id: EvalImage}` of a split written by `entropyrl prepare coco` (one row per image:
    its file, its reference captions, the prompt)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: not found (written by entropyrl prepare coco)")
    table = pq.read_table(path, columns=["prompt", "images", "reward_model", "extra_info"])
    images: dict[int, EvalImage] = {}
    for number, row in enumerate(table.to_pylist(), 1):
        where = f"{path}, row {number}"
        try:
            truth = json.loads(row["reward_model"]["ground_truth"])
            image_id = int(truth["image_id"])
            references = tuple(str(ref) for ref in truth["references"])
            files = row["images"]
            if not files or len(files) != 1:
                raise ValueError("a caption row holds exactly one image")
        except (KeyError, TypeError, ValueError) as error:
            raise InputFileError(f"{where}: not a prepared caption row ({error})") from None
        if image_id in images:
            raise InputFileError(f"{where}: image {image_id} appears twice")
        file = files[0]
        images[image_id] = EvalImage(
            image_id=image_id,
            path=file if isinstance(file, str) else str(file.get("image", file)),
            references=references,
            prompt=_prompt_text(row["prompt"]),
            source=str((row.get("extra_info") or {}).get("source", "")),
        )
    if not images:
        raise InputFileError(f"{path}: no rows")
    return images


def split_image_ids(path: str | os.PathLike[str]) -> set[int]:
    """The image ids of a prepared split (its `reward_model` column only)."""
    return set(read_split(path))


def sample_image_ids(candidates: Iterable[int], n: int, seed: int = DEFAULT_SEED) -> list[int]:
    """`n` ids drawn without replacement from the sorted candidates with `random.Random(seed)`,
    returned sorted: a function of the candidate set, `n` and `seed` only."""
    pool = sorted({int(image_id) for image_id in candidates})
    if n < 1:
        raise ValueError(f"the number of images must be >= 1, got {n}")
    if n > len(pool):
        raise ProtocolError(
            f"{n} images asked for, but only {len(pool)} held-out images are prepared"
        )
    return sorted(random.Random(seed).sample(pool, n))


def check_held_out(
    image_ids: Sequence[int], *, available: Mapping[int, Any], training: Iterable[int]
) -> None:
    """Refuse (ProtocolError, one line) a set with training images or images not prepared."""
    training = set(training)
    overlap = sorted(set(image_ids) & training)
    if overlap:
        raise ProtocolError(
            f"{len(overlap)} of the {len(image_ids)} evaluation images are training images "
            f"(e.g. {overlap[:5]}): a CHAIR set must be held out (data prepared with --restval "
            "trains on val2014 images); prepare the data again without --restval, or with "
            "`entropyrl prepare coco --hold-out LIST`, to keep them out of training"
        )
    missing = sorted(set(image_ids) - set(available))
    if missing:
        raise ProtocolError(
            f"{len(missing)} of the {len(image_ids)} evaluation images are not in the prepared "
            f"held-out split (e.g. {missing[:5]}); prepare them, or leave them out of the list"
        )
