"""verl on CPU: the `cpu` platform, the `hf` rollout and PyTorch stand-ins for GPU-only kernels.

Installed by `entropyrl.rig.cpu.extension`, which the plugin finds by name
(`entropyrl.verl.extensions`) in a process that selects `VERL_PLATFORM=cpu`; used by the smokes
and the tests, never by a GPU run.
"""
