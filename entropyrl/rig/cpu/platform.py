"""A CPU platform for verl 0.9.1: `VERL_PLATFORM=cpu` runs the trainer on machines without GPUs.

verl resolves its platform once per process (`verl.plugin.platform.get_platform`) and falls back
to CUDA when no accelerator answers. This module registers a platform named `cpu` with verl's
`PlatformRegistry`; verl picks it when `VERL_PLATFORM=cpu` is set (its own override variable).
The plugin entry point imports this module, when `VERL_PLATFORM=cpu` selects it, before anything
that asks for the platform (verl's FSDP engine module asks at import time), so every verl process
of a CPU run (driver, TaskRunner, Ray workers, reward workers) resolves the same platform; a
process without the selection never imports it.

Device conventions, as verl uses them:
- `current_device()` returns the string "cpu": verl passes `get_device_id()` where a device is
  expected (`tensor.to(get_device_id())`), and an int 0 would mean cuda:0.
- The Ray resource stays "GPU": verl's resource-pool check counts the `GPU` resource by name. The
  launcher declares logical GPUs (one per rank) to Ray; no CUDA is touched.
- Collectives use gloo.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from entropyrl.verl.names import CPU_PLATFORM as PLATFORM_NAME
from entropyrl.verl.names import cpu_selected


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _total_memory()


def _resident_memory() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _CpuStream:
    """Stands in for a device stream: CPU work is synchronous."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return _CpuEvent()


class _CpuEvent:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _cpu_device_module() -> ModuleType:
    """What verl calls on `get_torch_device()` (torch.cuda's names), answered for the CPU."""
    module = ModuleType("entropyrl_cpu_device")
    stream = _CpuStream()
    functions = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: PLATFORM_NAME,
        "set_device": lambda *args, **kwargs: None,
        "synchronize": lambda *args, **kwargs: None,
        "empty_cache": lambda: None,
        "ipc_collect": lambda: None,
        "get_device_name": lambda *args, **kwargs: "cpu",
        "current_stream": lambda *args, **kwargs: stream,
        "default_stream": lambda *args, **kwargs: stream,
        "stream": lambda *args, **kwargs: nullcontext(),
        "Stream": lambda *args, **kwargs: _CpuStream(),
        "Event": lambda *args, **kwargs: _CpuEvent(),
        "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
        "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "mem_get_info": lambda *args, **kwargs: (_available_memory(), _total_memory()),
        "memory_allocated": lambda *args, **kwargs: _resident_memory(),
        "memory_reserved": lambda *args, **kwargs: _resident_memory(),
        "max_memory_allocated": lambda *args, **kwargs: _resident_memory(),
        "max_memory_reserved": lambda *args, **kwargs: _resident_memory(),
        "reset_peak_memory_stats": lambda *args, **kwargs: None,
        "set_per_process_memory_fraction": lambda *args, **kwargs: None,
        "memory_stats": lambda *args, **kwargs: {},
    }
    for name, function in functions.items():
        setattr(module, name, function)
    module.memory = SimpleNamespace(_set_allocator_settings=lambda settings: None)
    return module


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered for a machine with no accelerator (gloo, no streams)."""

    _module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a CPU run is asked for with VERL_PLATFORM=cpu.
        return cpu_selected()

    def current_device(self) -> Any:
        return PLATFORM_NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding the logical GPU resource; reading it
        # keeps verl's per-rank bookkeeping consistent, and nothing here opens a CUDA device.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
