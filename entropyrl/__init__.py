"""entropyrl: entropy-guided and hallucination-aware RL for Qwen and Qwen-VL models.

The algorithm core (`entropyrl.core`: entropy, advantages, maxent, losses, clip schedules, the
estimator table) is plain PyTorch on tensors; engines (verl in `entropyrl.verl`, the
single-process runner in `entropyrl.rig.local`) only move tensors into it.
"""

__version__ = "0.2.0.dev0"
