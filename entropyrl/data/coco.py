"""COCO 2014 captions -> verl RLHF parquet, the CIDEr-D df file and the CHAIR ground truth.

Rows: ``data_source`` "coco_caption", ``prompt = [{"role": "user", "content": "<image>..."}]``,
``images = [absolute path]``, ``ability`` "captioning", ``reward_model = {"style": "rule",
"ground_truth": <JSON string {"image_id", "references"}>}`` (a string because verl passes it
through untouched and parquet keeps it exactly), ``extra_info = {"split", "index", "image_id",
"file_name", "source"}``.

Splits: with Karpathy's ``dataset_coco.json`` its train+restval / val / test; without it, every
train2014 image is train and val2014 images are ordered by a stable hash of their id: the first
``val_size`` are val, the next ``test_size`` test, the rest train (the same shape as Karpathy's).
``cider_df.json.gz`` holds the document frequencies of the train references (CIDEr-D in RL needs
corpus statistics, see ``entropyrl.rewards.cider``); ``chair_ground_truth.json`` maps every
written image id to its COCO objects (``chair_server`` builds it from the annotation files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.data.io import InputFileError, RejectLog, progress, read_json
from entropyrl.files import stable_hash, write_json, write_parquet

__all__ = ["DEFAULT_CAPTION_PROMPT", "SPLITS", "prepare_coco"]

DEFAULT_CAPTION_PROMPT = "<image>Please describe this image in detail."
SPLITS = ("train", "val", "test")
_KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


@dataclass
class _Image:
    image_id: int
    file_name: str
    folder: str
    split: str
    references: list[str]
    source: str
    line: int | str


def _coco_images(annotations_dir: Path, rejects: RejectLog) -> list[_Image]:
    """Images with their captions from ``captions_{train,val}2014.json`` (whichever exist)."""
    files = [annotations_dir / f"captions_{part}2014.json" for part in ("train", "val")]
    present = [path for path in files if path.is_file()]
    if not present:
        raise InputFileError(
            f"{annotations_dir}: no captions_train2014.json or captions_val2014.json found"
        )
    images: list[_Image] = []
    for path in present:
        folder = "train2014" if "train" in path.name else "val2014"
        data = read_json(path)
        if not isinstance(data, Mapping) or not isinstance(data.get("images"), list):
            raise InputFileError(f"{path}: not a COCO captions file (no 'images' list)")
        if not isinstance(data.get("annotations"), list):
            raise InputFileError(f"{path}: not a COCO captions file (no 'annotations' list)")
        by_id: dict[int, _Image] = {}
        for index, image in enumerate(data["images"]):
            where = f"images[{index}]"
            if not isinstance(image, Mapping) or not isinstance(image.get("id"), int):
                rejects.add(where, "field 'id' must be an integer", source=str(path))
                continue
            if not isinstance(image.get("file_name"), str):
                rejects.add(where, "field 'file_name' must be a string", source=str(path))
                continue
            by_id[image["id"]] = _Image(
                image["id"], image["file_name"], folder, "", [], str(path), where
            )
        for index, annotation in enumerate(progress(data["annotations"], desc=path.name)):
            where = f"annotations[{index}]"
            if not isinstance(annotation, Mapping):
                rejects.add(where, "not an object", source=str(path))
                continue
            caption, image_id = annotation.get("caption"), annotation.get("image_id")
            if not isinstance(caption, str) or not caption.strip():
                rejects.add(where, "field 'caption' must be a non-empty string", source=str(path))
            elif image_id not in by_id:
                rejects.add(where, f"image_id {image_id!r} is not in 'images'", source=str(path))
            else:
                by_id[image_id].references.append(caption.strip())
        for image in by_id.values():
            if folder == "train2014":
                image.split = "train"
        images.extend(by_id.values())
    return images


def _karpathy_images(path: Path, rejects: RejectLog) -> list[_Image]:
    """Images, splits and sentences from Karpathy's ``dataset_coco.json``."""
    data = read_json(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("images"), list):
        raise InputFileError(f"{path}: not a Karpathy split file (no 'images' list)")
    images = []
    for index, entry in enumerate(progress(data["images"], desc=path.name)):
        where = f"images[{index}]"
        try:
            if not isinstance(entry, Mapping):
                raise ValueError("not an object")
            for key, kind in (
                ("cocoid", int),
                ("filename", str),
                ("filepath", str),
                ("split", str),
            ):
                if not isinstance(entry.get(key), kind):
                    raise ValueError(f"field {key!r} must be a {kind.__name__}")
            if entry["split"] not in _KARPATHY_SPLITS:
                raise ValueError(
                    f"field 'split' is {entry['split']!r}, not one of {sorted(_KARPATHY_SPLITS)}"
                )
            sentences = entry.get("sentences")
            if not isinstance(sentences, list):
                raise ValueError("field 'sentences' must be a list")
            references = []
            for sentence in sentences:
                raw = sentence.get("raw") if isinstance(sentence, Mapping) else None
                if not isinstance(raw, str):
                    raise ValueError("every sentence needs a string 'raw'")
                if raw.strip():
                    references.append(raw.strip())
        except ValueError as error:
            rejects.add(where, str(error), source=str(path))
            continue
        images.append(
            _Image(
                entry["cocoid"],
                entry["filename"],
                entry["filepath"],
                _KARPATHY_SPLITS[entry["split"]],
                references,
                str(path),
                where,
            )
        )
    return images


def _assign_val2014(images: list[_Image], val_size: int, test_size: int) -> None:
    """val2014 images without a split: stable-hash order, val_size val, test_size test, rest train."""
    pending = sorted(
        (image for image in images if not image.split),
        key=lambda image: stable_hash("coco-val2014-split", image.image_id),
    )
    for position, image in enumerate(pending):
        if position < val_size:
            image.split = "val"
        elif position < val_size + test_size:
            image.split = "test"
        else:
            image.split = "train"


def _image_path(images_dir: Path, image: _Image) -> Path:
    nested = images_dir / image.folder / image.file_name
    return (
        nested
        if nested.is_file() or not (images_dir / image.file_name).is_file()
        else images_dir / image.file_name
    )


def prepare_coco(
    annotations_dir: str | os.PathLike[str],
    images_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    karpathy: str | os.PathLike[str] | None = None,
    prompt: str = DEFAULT_CAPTION_PROMPT,
    val_size: int = 5000,
    test_size: int = 5000,
    check_images: bool = True,
    chair_ground_truth: bool = True,
    data_source: str = "coco_caption",
    hold_out: Iterable[int] | None = None,
) -> dict[str, Any]:
    """Write ``{train,val,test}.parquet``, ``cider_df.json.gz`` and ``chair_ground_truth.json``.

    ``hold_out``: image ids put into the test split whatever split they would have had (a
    paper's CHAIR or POPE images, so that training never sees them); ids not among the images
    are named in the warnings.

    Images without references or (with ``check_images``) without a file are rejected and listed
    in ``out_dir/rejects.jsonl`` and the summary. Raises InputFileError for missing or malformed
    annotation / Karpathy files.
    """
    from entropyrl.rewards.cider import CiderD

    annotations_dir, images_dir, out_dir = Path(annotations_dir), Path(images_dir), Path(out_dir)
    if not annotations_dir.is_dir():
        raise InputFileError(f"{annotations_dir}: annotations folder not found")
    if check_images and not images_dir.is_dir():
        raise InputFileError(f"{images_dir}: images folder not found")
    if "<image>" not in prompt:
        prompt = "<image>" + prompt
    if prompt.count("<image>") != 1:
        raise ValueError("prompt must hold exactly one <image> placeholder (one image per row)")
    rejects = RejectLog()
    if karpathy is not None:
        images = _karpathy_images(Path(karpathy), rejects)
    else:
        images = _coco_images(annotations_dir, rejects)
    source = "karpathy" if karpathy is not None else "coco2014"
    valid: list[_Image] = []
    seen: set[int] = set()
    for image in progress(sorted(images, key=lambda item: item.image_id), desc="images"):
        if image.image_id in seen:
            rejects.add(image.line, f"image id {image.image_id} listed twice", source=image.source)
            continue
        if not image.references:
            rejects.add(
                image.line, f"image {image.image_id} has no reference caption", source=image.source
            )
            continue
        path = _image_path(images_dir, image)
        if check_images and not path.is_file():
            rejects.add(image.line, f"image file not found: {path}", source=image.source)
            continue
        seen.add(image.image_id)
        image.file_name = str(path.resolve())
        valid.append(image)
    held = {int(image_id) for image_id in hold_out or ()}
    for image in valid:
        if image.image_id in held:
            image.split = "test"
    # Split after rejecting, so val_size / test_size count usable images.
    _assign_val2014(valid, val_size, test_size)
    kept: dict[str, list[_Image]] = {split: [] for split in SPLITS}
    for image in valid:
        kept[image.split].append(image)

    outputs: dict[str, str] = {}
    for split, items in kept.items():
        rows = [
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": prompt}],
                "images": [image.file_name],
                "ability": "captioning",
                "reward_model": {
                    "style": "rule",
                    "ground_truth": json.dumps(
                        {"image_id": image.image_id, "references": image.references},
                        ensure_ascii=False,
                    ),
                },
                "extra_info": {
                    "split": split,
                    "index": index,
                    "image_id": image.image_id,
                    "file_name": Path(image.file_name).name,
                    "source": source,
                },
            }
            for index, image in enumerate(items)
        ]
        path = out_dir / f"{split}.parquet"
        if rows:
            write_parquet(rows, path)
            outputs[split] = str(path)
        else:
            path.unlink(missing_ok=True)

    warnings: list[str] = []
    absent = sorted(held - {image.image_id for image in valid})
    if absent:
        warnings.append(
            f"{len(absent)} held-out image(s) are not among the usable images, e.g. {absent[:5]}"
        )
    if kept["train"]:
        cider = CiderD.from_references(
            {image.image_id: image.references for image in kept["train"]}
        )
        cider.save(out_dir / "cider_df.json.gz")
        outputs["cider_df"] = str(out_dir / "cider_df.json.gz")
    else:
        warnings.append("no train images: cider_df.json.gz not written")
    if chair_ground_truth:
        outputs.update(_write_chair_ground_truth(annotations_dir, out_dir, seen, warnings))
    rejects_file = rejects.write(out_dir / "rejects.jsonl")
    return {
        "source": source,
        "rows": {split: len(items) for split, items in kept.items()},
        "rows_rejected": len(rejects),
        "held_out": len(held) - len(absent),
        "outputs": outputs,
        "rejects_file": str(rejects_file) if rejects_file else None,
        "first_rejects": rejects.first(20),
        "warnings": warnings,
    }


def _write_chair_ground_truth(
    annotations_dir: Path, out_dir: Path, image_ids: set[int], warnings: list[str]
) -> dict[str, str]:
    """``{"<image_id>": [categories]}`` for the written images, from chair_server's parser."""
    try:
        from chair_server.scorer import ChairScorer
    except ImportError as error:
        warnings.append(
            f"chair_server not importable ({error}): chair_ground_truth.json not written"
        )
        return {}
    try:
        # chair_server's own cache: a CHAIR service started on the same folder reuses the parse
        scorer = ChairScorer.from_coco(annotations_dir)
    except (FileNotFoundError, ValueError) as error:
        warnings.append(f"CHAIR ground truth not built: {error}")
        return {}
    truth = scorer.ground_truth()
    missing = sorted(image_id for image_id in image_ids if image_id not in truth)
    if missing:
        warnings.append(
            f"{len(missing)} image(s) have no CHAIR ground truth in {annotations_dir}, e.g. {missing[:5]}"
        )
    path = out_dir / "chair_ground_truth.json"
    write_json(
        {str(image_id): truth[image_id] for image_id in sorted(image_ids) if image_id in truth},
        path,
    )
    return {"chair_ground_truth": str(path)}
