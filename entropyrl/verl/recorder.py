"""The trainer's and the loss's optional per-sample recorder.

The smoke check (`entropyrl.rig.smoke.check`) reads the rows the trainer and the actor loss
write per sample (`entropyrl.rig.trace`) when a run asks for them with `ENTROPYRL_TRACE_DIR`
(the smoke sets it). `recorder()` hands them that module then, and None otherwise: a run that
does not ask never imports it. The module lives in the rig, above the plugin, so it is found
by name (`entropyrl.verl.extensions`).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

TRACE_ENV = "ENTROPYRL_TRACE_DIR"


def recorder() -> ModuleType | None:
    """`entropyrl.rig.trace` when this process records ($ENTROPYRL_TRACE_DIR set), else None."""
    if not os.environ.get(TRACE_ENV):
        return None
    return _trace_module()


@functools.cache
def _trace_module() -> ModuleType:
    # Once per process: the loss asks on every micro-batch, and the lookup reads the metadata
    # of every installed copy of entropyrl.
    from entropyrl.verl import extensions

    return extensions.load(extensions.TRACE)
