"""COCO 2014 captions -> verl RLHF parquet, the CIDEr-D df file, the CHAIR ground truth and a
manifest of the split.

Rows: ``data_source`` "coco_caption", ``prompt = [{"role": "user", "content": "<image>..."}]``,
``images = [absolute path]``, ``ability`` "captioning", ``reward_model = {"style": "rule",
"ground_truth": <JSON string {"image_id", "references"}>}`` (a string because verl passes it
through untouched and parquet keeps it exactly), ``extra_info = {"split", "index", "image_id",
"file_name", "source"}``; ``source`` is "karpathy" or "coco2014" (the hash split) where the row
sits in the split its input gave it, and adds why where the row was moved into the test split:
"karpathy_restval" / "coco2014_restval" (the rule below), "karpathy_hold_out" /
"coco2014_hold_out" (``hold_out``).

Splits: Karpathy's (``dataset_coco.json``, or the rows of a mirror: ``_karpathy_images``) train /
restval / val / test; without it every train2014 image is train and val2014 images are ordered
by a stable hash of their id: the first ``val_size`` are val, the next ``test_size`` test, the
rest restval (the same shape as Karpathy's). Every evaluation this project ships scores val2014
images (CHAIR: a seeded sample of the test split or a paper's val2014 list; POPE: the released
files' 500 val2014 images, or a rebuild over the test split), so no val2014 image goes to
training: restval joins the test split, where the evaluations draw from. ``restval=True`` keeps
it in training (papers' 113,287 Karpathy train images), with a warning. ``manifest.json`` records
the rule, the images per split and COCO source, the images moved out of training and the
Karpathy file's sha256. ``cider_df.json.gz`` holds the document frequencies of the train
references (CIDEr-D in RL needs corpus statistics, see ``entropyrl.rewards.cider``);
``chair_ground_truth.json`` maps every written image id to its COCO objects (``chair_server``
builds it from the annotation files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image as PILImage

from entropyrl.core.files import stable_hash, write_json, write_parquet
from entropyrl.data.io import (
    InputFileError,
    RejectLog,
    file_sha256,
    progress,
    read_json,
    read_records,
)

__all__ = ["DEFAULT_CAPTION_PROMPT", "KARPATHY_LAYOUTS", "SPLITS", "prepare_coco"]

DEFAULT_CAPTION_PROMPT = "<image>Please describe this image in detail."
SPLITS = ("train", "val", "test")
# Karpathy's split names; Hugging Face mirrors call their val split "validation".
_KARPATHY_SPLITS = {
    "train": "train",
    "restval": "restval",
    "val": "val",
    "validation": "val",
    "test": "test",
}
_KARPATHY_FIELDS = {"cocoid": int, "filename": str, "filepath": str, "split": str}
KARPATHY_LAYOUTS = {
    "dataset_coco.json": "Karpathy's dataset_coco.json: {images: [{filepath, filename, cocoid, "
    "split, sentences: [{raw, tokens}]}]}",
    "rows": "yerevann/coco-karpathy's rows (parquet, a JSON list or JSON lines): {filepath, "
    "filename, cocoid, split, sentences: [text]}",
}
# No published sha256 of dataset_coco.json is known here (the Hub lists the mirror's files'
# sha256 on their pages): the manifest records each file's sha256; nothing is checked.
KARPATHY_PUBLISHED_SHA256: str | None = None


@dataclass
class _Image:
    image_id: int
    file_name: str
    folder: str
    split: str
    references: list[str]
    source: str
    line: int | str
    given: str = ""  # the split the input (or the hash split) gave; `split` is where it goes
    size: tuple[int, int] | None = None  # (width, height), read from the file's header


def _coco_part(image: _Image) -> str:
    """ "train2014" or "val2014": the COCO 2014 release an image comes from ("" if neither)."""
    for text in (Path(image.file_name).name, image.folder):
        for part in ("val2014", "train2014"):
            if part in text:
                return part
    return ""


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
                image.split = image.given = "train"
        images.extend(by_id.values())
    return images


def _karpathy_files(path: Path) -> list[Path]:
    """The file itself, or a folder's ``*.parquet`` files (a mirror's download), sorted."""
    if path.is_dir():
        files = sorted(
            file
            for file in path.rglob("*.parquet")
            if not any(part.startswith(".") for part in file.relative_to(path).parts)
        )
        if not files:
            raise InputFileError(f"{path}: no .parquet file in this folder (Karpathy's splits)")
        return files
    if not path.is_file():
        raise InputFileError(f"{path}: Karpathy split file not found")
    return [path]


def _karpathy_records(path: Path) -> tuple[list[tuple[str, Any]], str]:
    """``([(where, record)], container)`` of one file, before any field is checked."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as error:  # pyarrow raises several types for a file that is not parquet
            raise InputFileError(f"{path}: not a parquet file ({error})") from None
        missing = [name for name in (*_KARPATHY_FIELDS, "sentences") if name not in schema.names]
        if missing:
            raise InputFileError(
                f"{path}: no column {missing[0]!r}; expected {KARPATHY_LAYOUTS['rows']}"
            )
        table = pq.read_table(path, columns=[*_KARPATHY_FIELDS, "sentences"])
        return [(f"row {i + 1}", row) for i, row in enumerate(table.to_pylist())], "rows"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InputFileError(f"{path}: not UTF-8 text ({error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":  # JSON lines read as one document stop at line 2
            raise InputFileError(
                f"{path}, line {error.lineno}, column {error.colno}: invalid JSON ({error.msg})"
            ) from None
        return [(f"line {number}", row) for number, row in read_records(path)], "rows"
    if isinstance(data, Mapping):
        if not isinstance(data.get("images"), list):
            raise InputFileError(
                f"{path}: no 'images' list; expected {KARPATHY_LAYOUTS['dataset_coco.json']}"
            )
        return [(f"images[{i}]", row) for i, row in enumerate(data["images"])], "images"
    if isinstance(data, list):
        return [(f"item {i + 1}", row) for i, row in enumerate(data)], "rows"
    raise InputFileError(
        f"{path}: neither {KARPATHY_LAYOUTS['dataset_coco.json']} nor {KARPATHY_LAYOUTS['rows']}"
    )


def _entry_problem(entry: Any) -> str | None:
    """What keeps a Karpathy record from being read (naming the field), or None."""
    if not isinstance(entry, Mapping):
        return "not an object"
    for key, kind in _KARPATHY_FIELDS.items():
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"field {key!r} must be a {kind.__name__}"
    sentences = entry.get("sentences")
    if not isinstance(sentences, list):
        return "field 'sentences' must be a list"
    for sentence in sentences:
        if not isinstance(sentence, str) and not (
            isinstance(sentence, Mapping) and isinstance(sentence.get("raw"), str)
        ):
            return "field 'sentences' must hold texts or objects with a string 'raw'"
    return None


def _karpathy_images(path: Path, rejects: RejectLog) -> tuple[list[_Image], list[dict[str, Any]]]:
    """Images, splits and sentences from Karpathy's split file(s), and each file's record.

    Layouts (detected per file from its container and first record): Karpathy's
    ``dataset_coco.json`` and the rows of the Hugging Face dataset ``yerevann/coco-karpathy``
    (parquet files, or the same rows as a JSON list or JSON lines), whose ``sentences`` are the
    texts themselves. A file whose first record matches neither is an error naming the file and
    the field; a later record that does not is rejected (listed in rejects.jsonl)."""
    images: list[_Image] = []
    files: list[dict[str, Any]] = []
    for file in _karpathy_files(path):
        records, container = _karpathy_records(file)
        if not records:
            raise InputFileError(f"{file}: no images listed")
        where, first = records[0]
        problem = _entry_problem(first)
        if problem is not None:
            raise InputFileError(
                f"{file}, {where}: {problem}; neither {KARPATHY_LAYOUTS['dataset_coco.json']} "
                f"nor {KARPATHY_LAYOUTS['rows']}"
            )
        texts = all(isinstance(s, str) for s in first["sentences"])
        files.append(
            {
                "path": str(file.resolve()),
                "sha256": file_sha256(file),
                "layout": "dataset_coco.json" if container == "images" else "rows",
                "sentences": "texts" if texts else "objects with 'raw'",
                "records": len(records),
            }
        )
        for where, entry in progress(records, desc=file.name):
            problem = _entry_problem(entry)
            if problem is None and entry["split"] not in _KARPATHY_SPLITS:
                problem = (
                    f"field 'split' is {entry['split']!r}, not one of {sorted(_KARPATHY_SPLITS)}"
                )
            if problem is not None:
                rejects.add(where, problem, source=str(file))
                continue
            references = []
            for sentence in entry["sentences"]:
                raw = sentence if isinstance(sentence, str) else sentence["raw"]
                if raw.strip():
                    references.append(raw.strip())
            split = _KARPATHY_SPLITS[entry["split"]]
            images.append(
                _Image(
                    entry["cocoid"],
                    entry["filename"],
                    entry["filepath"],
                    split,
                    references,
                    str(file),
                    where,
                    given=split,
                )
            )
    return images, files


def _assign_val2014(images: list[_Image], val_size: int, test_size: int) -> None:
    """val2014 images without a split: stable-hash order, val_size val, test_size test, the rest
    restval (Karpathy's name for the val2014 images outside its val and test)."""
    pending = sorted(
        (image for image in images if not image.split),
        key=lambda image: stable_hash("coco-val2014-split", image.image_id),
    )
    for position, image in enumerate(pending):
        if position < val_size:
            image.split = image.given = "val"
        elif position < val_size + test_size:
            image.split = image.given = "test"
        else:
            image.split = image.given = "restval"


def _require_each_release(
    images_dir: Path, listed: dict[str, int], found: dict[str, int], sought: dict[str, Path]
) -> None:
    """A COCO release (train2014, val2014) listed in the annotations of which not one image is
    under `--images` is a wrong folder, not a set of rejects: an `--images` one level too deep
    (coco/val2014) leaves val and test empty."""
    for part, count in sorted(listed.items()):
        if part and count and not found.get(part):
            raise InputFileError(
                f"{images_dir}: none of the {count} {part} images found (the first sought: "
                f"{sought[part]}); --images is the folder that holds train2014/ and val2014/"
            )


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
    restval: bool = False,
) -> dict[str, Any]:
    """Write ``{train,val,test}.parquet``, ``cider_df.json.gz``, ``chair_ground_truth.json`` and
    ``manifest.json``.

    ``karpathy``: Karpathy's ``dataset_coco.json``, a mirror's rows file, or a folder of a
    mirror's parquet files (see ``_karpathy_images``); None: the hash split of val2014.
    ``restval``: keep the val2014 images outside val and test (Karpathy's restval, the hash
    split's rest) in training, as papers do; by default they join the test split, so that no
    val2014 image (CHAIR's and POPE's images are val2014) is trained on. ``hold_out``: image ids
    put into the test split whatever split they would have had (a paper's CHAIR or POPE list);
    ids not among the images are named in the warnings.

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
    karpathy_files: list[dict[str, Any]] = []
    if karpathy is not None:
        images, karpathy_files = _karpathy_images(Path(karpathy), rejects)
    else:
        images = _coco_images(annotations_dir, rejects)
    source = "karpathy" if karpathy is not None else "coco2014"
    valid: list[_Image] = []
    seen: set[int] = set()
    # per COCO release: how many images are listed, how many were found, where the first was sought
    listed: dict[str, int] = {}
    found: dict[str, int] = {}
    sought: dict[str, Path] = {}
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
        part = _coco_part(image)
        listed[part] = listed.get(part, 0) + 1
        sought.setdefault(part, path)
        if check_images and not path.is_file():
            rejects.add(image.line, f"image file not found: {path}", source=image.source)
            continue
        if check_images:
            try:  # the header only: the size bounds the prompt's tokens (manifest.json)
                with PILImage.open(path) as opened:
                    image.size = opened.size
            except (OSError, ValueError) as error:
                rejects.add(image.line, f"unreadable image {path}: {error}", source=image.source)
                continue
        seen.add(image.image_id)
        found[part] = found.get(part, 0) + 1
        image.file_name = str(path.resolve())
        valid.append(image)
    if check_images:
        _require_each_release(images_dir, listed, found, sought)
    held = {int(image_id) for image_id in hold_out or ()}
    moved: dict[int, str] = {}  # image id -> why it left the split its input gave it
    for image in valid:
        if image.image_id in held:
            if image.given != "test":
                moved[image.image_id] = "hold_out"
            image.split = "test"
    # Split after rejecting, so val_size / test_size count usable images.
    _assign_val2014(valid, val_size, test_size)
    rest = 0  # val2014 images outside val and test: restval
    for image in valid:
        if image.split == "restval" or (image.split == "train" and _coco_part(image) == "val2014"):
            rest += 1
            image.split = "train" if restval else "test"
            if not restval:
                moved[image.image_id] = "restval"
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
                    "source": (
                        f"{source}_{moved[image.image_id]}" if image.image_id in moved else source
                    ),
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
    in_train = sorted(i.image_id for i in kept["train"] if _coco_part(i) == "val2014")
    given = {split: sum(image.given == split for image in valid) for split in ("val", "test")}
    rule = _split_rule(source, given, rest, restval)
    if karpathy is None:
        warnings.append(rule)
    if in_train:
        warnings.append(
            f"--restval: {len(in_train)} val2014 images are in train.parquet; CHAIR's and POPE's "
            "images are val2014, so a paper's list or POPE's released files overlap training "
            "(eval-chair refuses such a list and counts the overlap in POPE's note)"
        )
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
    manifest = out_dir / "manifest.json"
    write_json(
        {
            **_manifest(rule, source, restval, kept, moved, absent, in_train, karpathy_files),
            **_prompt_inputs(kept, prompt, check_images),
        },
        manifest,
    )
    outputs["manifest"] = str(manifest)
    return {
        "source": source,
        "split_rule": rule,
        "rows": {split: len(items) for split, items in kept.items()},
        "rows_rejected": len(rejects),
        "held_out": len(held) - len(absent),
        "val2014_in_train": len(in_train),
        "outputs": outputs,
        "rejects_file": str(rejects_file) if rejects_file else None,
        "first_rejects": rejects.first(20),
        "warnings": warnings,
    }


def _split_rule(source: str, given: Mapping[str, int], rest: int, restval: bool) -> str:
    """One line: which split was made, and where the val2014 images outside val / test went."""
    where = "in train.parquet (--restval)" if restval else "held out in test.parquet"
    if source == "karpathy":
        return f"Karpathy's split; its restval ({rest:,} val2014 images) {where}" + (
            "" if restval else ": no val2014 image is trained on (CHAIR, POPE use val2014)"
        )
    return (
        "no --karpathy: a hash split, not Karpathy's: train2014 is train; val2014 by a stable "
        f"hash of the image id: {given['val']:,} val, {given['test']:,} test, the other "
        f"{rest:,} {where}; Karpathy's val/test are other images, so CIDEr-D on this test "
        "split does not compare with papers' Karpathy-test figures"
    )


def _prompt_inputs(
    kept: Mapping[str, list[_Image]], prompt: str, sizes_read: bool
) -> dict[str, Any]:
    """What bounds a row's prompt in tokens without opening an image (the launch's preflight,
    `entropyrl.data.prompt_length`): the prompt every row holds and each split's image sizes
    (width x height: count); None when the images were not read (`check_images` off)."""
    sizes: dict[str, dict[str, int]] | None = None
    if sizes_read:
        sizes = {}
        for split, items in kept.items():
            counts: dict[str, int] = {}
            for image in items:
                if image.size is not None:
                    key = f"{image.size[0]}x{image.size[1]}"
                    counts[key] = counts.get(key, 0) + 1
            sizes[split] = dict(sorted(counts.items()))
    return {
        "prompts": [[{"role": "user", "content": prompt}]],
        "image_sizes": sizes,
    }


def _manifest(
    rule: str,
    source: str,
    restval: bool,
    kept: Mapping[str, list[_Image]],
    moved: Mapping[int, str],
    absent: list[int],
    in_train: list[int],
    karpathy_files: list[dict[str, Any]],
) -> dict[str, Any]:
    """What ``manifest.json`` records: the rule, the images per split and COCO source, the images
    moved out of the split their input gave them (and why), the Karpathy file(s) and sha256."""
    counts = {}
    for split, items in kept.items():
        parts: dict[str, int] = {"train2014": 0, "val2014": 0}
        for image in items:
            part = _coco_part(image) or "other"
            parts[part] = parts.get(part, 0) + 1
        counts[split] = parts
    moved_ids = {
        why: sorted(image_id for image_id, reason in moved.items() if reason == why)
        for why in ("restval", "hold_out")
    }
    return {
        "written_by": "entropyrl prepare coco",
        "split_rule": rule,
        "splits_from": "karpathy" if source == "karpathy" else "hash of the val2014 image ids",
        "restval_in": "train" if restval else "test",
        "images": counts,
        "moved_to_test": {
            "restval": {
                "why": "val2014 images outside val and test: CHAIR's and POPE's images are "
                "val2014, so none is trained on",
                "image_ids": moved_ids["restval"],
            },
            "hold_out": {
                "why": "the --hold-out list (a paper's evaluation images)",
                "image_ids": moved_ids["hold_out"],
                "not_found": absent,
            },
        },
        "val2014_in_train": in_train,
        "karpathy": (
            {
                "files": karpathy_files,
                "published_sha256": KARPATHY_PUBLISHED_SHA256,
                "checked": "no: no published sha256 of dataset_coco.json is known; compare "
                "the sha256 above with the mirror's page on the Hub or between preparations",
            }
            if source == "karpathy"
            else None
        ),
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
