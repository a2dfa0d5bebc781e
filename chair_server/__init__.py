"""Standalone CHAIR object-hallucination service (`python -m chair_server`).

No torch import anywhere in this package: it runs on any machine with Python and Flask.
"""

__version__ = "0.2.0.dev0"

__all__ = ["ChairScorer", "__version__"]


def __getattr__(name: str) -> object:
    # the scorer loads on first use: `chair_server.options` (every command line) stays light
    if name == "ChairScorer":
        from chair_server.scorer import ChairScorer

        return ChairScorer
    raise AttributeError(f"module 'chair_server' has no attribute {name!r}")
