"""Standalone CHAIR object-hallucination service (`python -m chair_server`).

No torch import anywhere in this package: it runs on any machine with Python and Flask.
"""

__version__ = "0.2.0.dev0"

from chair_server.scorer import ChairScorer

__all__ = ["ChairScorer", "__version__"]
