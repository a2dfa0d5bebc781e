"""verl on CPU: the `cpu` platform, the `hf` rollout and PyTorch stand-ins for GPU-only kernels.

Registered by `entropyrl.verl.plugin`; used by the smokes and the tests, never by a GPU run.
"""
