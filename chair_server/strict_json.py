"""JSON the CHAIR service and its tools write: a non-finite number (NaN, infinity) is ``null``.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which strict parsers (jq,
JavaScript's ``JSON.parse``) reject. The scorer's own ratios are never NaN (a ratio over nothing
is None already, see ``scorer.CorpusMetrics.result``); what can carry one is a value echoed from
the input, e.g. an ``image_id`` written ``NaN`` in a captions file, which Python's reader
accepts. This is the service's own small copy of ``entropyrl.core.files.json_dumps``: the service
imports neither entropyrl nor torch.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(obj: Any) -> Any:
    """``obj`` with every NaN and infinity as None, through dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(value) for value in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, allow_nan=False, **kwargs)``, with non-finite numbers as null.

    The value is walked only when it holds one (the first attempt refuses it), so the service's
    answers cost what plain ``json.dumps`` costs."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError as exc:
        if "Out of range float" not in str(exc):  # e.g. a circular reference: not ours to map
            raise
        return json.dumps(finite(obj), allow_nan=False, **kwargs)
