"""Ground-truth object sets per image: from COCO annotation files (cached on disk) or a JSON file.

The CHAIR convention (Rohrbach et al. 2018): an image's ground truth is the union of the
categories of its instance annotations and the objects mentioned in its reference captions,
parsed with the same rules as the generated captions. Train and val files are merged so any
COCO image id works.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from chair_server import vocabulary
from chair_server.mentions import MentionExtractor

ImageId = int | str
GroundTruth = dict[ImageId, frozenset[str]]

COCO_FILES: tuple[str, ...] = (
    "instances_train2014.json",
    "instances_val2014.json",
    "captions_train2014.json",
    "captions_val2014.json",
)
CACHE_FORMAT = 1


def normalize_image_id(value: object, *, field: str = "image_id") -> ImageId:
    """COCO ids are ints; digit strings become ints, other non-empty strings stay strings.

    Raises ValueError naming ``field`` for anything else (bools, floats, lists, empty strings).
    """
    if isinstance(value, bool):
        raise ValueError(f"{field} must be an integer or a string, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip():
        text = value.strip()
        return int(text) if text.isdigit() else text
    raise ValueError(f"{field} must be an integer or a non-empty string, got {value!r}")


def default_cache_dir() -> Path:
    """``$CHAIR_CACHE_DIR``, else ``$XDG_CACHE_HOME/chair_server``, else ``~/.cache/chair_server``."""
    if os.environ.get("CHAIR_CACHE_DIR"):
        return Path(os.environ["CHAIR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "chair_server"


def coco_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The COCO 2014 annotation files present in ``folder`` (any subset of the four)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"COCO annotation folder does not exist: {root}")
    found = [root / name for name in COCO_FILES if (root / name).is_file()]
    if not found:
        raise FileNotFoundError(
            f"no COCO annotation file in {root}: expected at least one of {', '.join(COCO_FILES)}"
        )
    return found


def _cache_key(files: list[Path]) -> str:
    stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return vocabulary.fingerprint({"files": stats, "format": CACHE_FORMAT})


def cache_path(folder: str | os.PathLike[str], cache_dir: str | os.PathLike[str]) -> Path:
    """Where the ground-truth cache of ``folder`` lives (one file per folder and file state)."""
    files = coco_files(folder)
    folder_tag = vocabulary.fingerprint({"folder": str(Path(folder).resolve())})
    return Path(cache_dir) / f"gt-{folder_tag}-{_cache_key(files)}.json"


def build_from_coco(folder: str | os.PathLike[str], extractor: MentionExtractor) -> GroundTruth:
    """Parse the annotation files: instance categories ∪ objects in the reference captions."""
    objects: dict[ImageId, set[str]] = {}
    for path in coco_files(folder):
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
            raise ValueError(f"{path}: not a COCO annotation file (no 'annotations' list)")
        for image in data.get("images", []):
            objects.setdefault(
                normalize_image_id(image["id"], field=f"{path.name}: images.id"), set()
            )
        if path.name.startswith("instances"):
            names = {
                c["id"]: c["name"] for c in data.get("categories", [])
            } or vocabulary.CATEGORY_IDS
            for ann in data["annotations"]:
                image_id = normalize_image_id(ann["image_id"], field=f"{path.name}: image_id")
                name = names.get(ann["category_id"])
                if name is None:
                    raise ValueError(f"{path}: unknown category_id {ann['category_id']!r}")
                objects.setdefault(image_id, set()).add(_category_name(name, extractor, path))
        else:
            for ann in data["annotations"]:
                image_id = normalize_image_id(ann["image_id"], field=f"{path.name}: image_id")
                found = objects.setdefault(image_id, set())
                found.update(category for _, category in extractor.mentions(ann["caption"]))
    return {image_id: frozenset(cats) for image_id, cats in objects.items()}


def _category_name(name: str, extractor: MentionExtractor, source: object) -> str:
    category = extractor.names.get(str(name).strip().lower())
    if category is None:
        raise ValueError(f"{source}: {name!r} is not a COCO category or synonym")
    return category


def load_coco(
    folder: str | os.PathLike[str],
    extractor: MentionExtractor,
    *,
    cache_dir: str | os.PathLike[str] | None,
    use_cache: bool = True,
) -> tuple[GroundTruth, bool]:
    """Ground truth of a COCO folder and whether it came from the cache.

    The cache file name carries the files' names, sizes and mtimes and the vocabulary
    fingerprint, so editing an annotation file or the vocabulary builds a new one.
    """
    if not use_cache:
        return build_from_coco(folder, extractor), False
    path = cache_path(folder, cache_dir if cache_dir is not None else default_cache_dir())
    if path.is_file():
        try:
            return parse_mapping(json.loads(path.read_text(encoding="utf-8")), extractor), True
        except (ValueError, OSError):
            pass  # a damaged cache is rebuilt below
    objects = build_from_coco(folder, extractor)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(to_json(objects), tmp)
    os.replace(tmp.name, path)  # atomic: concurrent starts never read half a file
    for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.json"):
        if stale != path:  # an older state of the same folder
            stale.unlink(missing_ok=True)
    return objects, False


def parse_mapping(mapping: Mapping[object, object], extractor: MentionExtractor) -> GroundTruth:
    """``{"<image_id>": ["person", ...]}`` -> ground truth; synonyms map to their category."""
    if not isinstance(mapping, Mapping):
        raise ValueError("ground truth must be a JSON object {image_id: [category, ...]}")
    out: GroundTruth = {}
    for key, names in mapping.items():
        image_id = normalize_image_id(key, field="ground truth key")
        if not isinstance(names, list | tuple | set | frozenset):
            raise ValueError(f"ground truth for image {key!r} must be a list of category names")
        out[image_id] = frozenset(_category_name(n, extractor, f"image {key!r}") for n in names)
    return out


def load_mapping(
    path_or_mapping: str | os.PathLike[str] | Mapping, extractor: MentionExtractor
) -> GroundTruth:
    """Ground truth from a JSON file path or an in-memory mapping."""
    if isinstance(path_or_mapping, Mapping):
        return parse_mapping(path_or_mapping, extractor)
    with open(path_or_mapping, encoding="utf-8") as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path_or_mapping}: not valid JSON ({exc})") from exc
    return parse_mapping(data, extractor)


def to_json(objects: GroundTruth) -> dict[str, list[str]]:
    """``{"<image_id>": sorted category names}``, the format ``load_mapping`` reads."""
    return {str(k): sorted(v) for k, v in objects.items()}
