"""The CPU backend's entry point (`entropyrl.extensions:cpu`), which the plugin calls in a
process that selects `VERL_PLATFORM=cpu`."""

from __future__ import annotations


def install() -> None:
    """Register the `cpu` platform, install its backend fixes and register the `hf` rollout.

    The platform comes first: verl's FSDP engine module asks for it on import, and the plugin's
    trainer imports that module."""
    from entropyrl.rig.cpu import backend
    from entropyrl.rig.cpu import platform as _platform  # noqa: F401  (registers on import)

    backend.install()
    backend.register_hf_rollout()
