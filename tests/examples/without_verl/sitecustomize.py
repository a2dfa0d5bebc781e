"""A Python without verl (and the Hydra it brings), for tests: on PYTHONPATH, it makes both
look not installed to imports and to `importlib.metadata`, as on a machine that has only the
library and the local runner."""

import importlib.abc
import importlib.metadata
import sys

_HIDDEN = ("verl", "hydra")
_real_version = importlib.metadata.version


def version(name: str) -> str:
    if name.lower() in ("verl", "hydra-core"):
        raise importlib.metadata.PackageNotFoundError(name)
    return _real_version(name)


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


importlib.metadata.version = version
sys.meta_path.insert(0, _Hide())
