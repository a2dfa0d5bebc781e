"""The verl plugin: estimators, policy loss, trainer, reward functions and validation for verl 0.9.1.

`entropyrl.verl.plugin` is the `verl.plugins` entry point: verl imports it in every process
that imports verl, and it registers everything. This package's `__init__` stays empty so the
commands that only read a config (`entropyrl doctor`, the launch scripts' preflight) start
without importing verl. `entropyrl.rig.cpu` is the CPU backend (platform, `hf` rollout,
stand-ins for GPU-only kernels); the plugin registers it, nothing else here imports it.
"""
