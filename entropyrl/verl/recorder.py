"""The trainer's and the loss's optional per-sample recorder.

The smoke check (`entropyrl.commands.smoke_check`) reads the rows the trainer and the actor loss
write per sample (`entropyrl.verl.trace`) when a run asks for them with `ENTROPYRL_TRACE_DIR`
(the smoke sets it). `recorder()` hands them that module then, and None otherwise: a run that
does not ask never imports it.
"""

from __future__ import annotations

import os
from types import ModuleType

TRACE_ENV = "ENTROPYRL_TRACE_DIR"


def recorder() -> ModuleType | None:
    """`entropyrl.verl.trace` when this process records ($ENTROPYRL_TRACE_DIR set), else None."""
    if not os.environ.get(TRACE_ENV):
        return None
    from entropyrl.verl import trace

    return trace
