"""TensorDict fields as plain tensors: verl 0.9.1 hands per-token fields over as nested tensors."""

from __future__ import annotations

from typing import Any

import torch


def padded(value: Any) -> torch.Tensor | None:
    """A padded tensor (zeros after each row's end) from a possibly nested field; None stays None."""
    return value.to_padded_tensor(0) if getattr(value, "is_nested", False) else value
