"""Models and their pre-processing, from local folders only (no download): checkpoints loaded
from disk (`loading`), the Qwen-VL processors without their video half (`processor`) and
Qwen-VL's image pre-processing with Pillow alone (`images`). The tiny models built from a
config for the CPU runs live in the CPU wing, `entropyrl.rig.tiny`.
"""
