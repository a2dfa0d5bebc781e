"""Samples a step trained on without a CHAIR score: bounded, like lost samples.

A caption the CHAIR service gave no answer for (down, or unreachable from the node of the
reward worker that asked) keeps its CIDEr-D reward and takes the clip schedule's neutral bound
and no CHAIR penalty (`entropyrl.rewards.caption` marks it `chair_fallback`): a whole outage
would turn the recipe into plain GRPO at the neutral bound, and an `EXPERIMENT=penalty` run into
an unpenalised one, visible only in `chair/fallback_samples`. Per training step the trainer
calls `judge` on the real (non-padding) rows:

- more fallbacks than `algorithm.chair_fallback.max_fraction` of them stop the run with one line
  naming the service (its URL) and the node;
- at most that many, and at least one: one warning line for the step;
- `CHAIR_OPTIONAL=1` (environment, the launcher's documented way to train without CHAIR) lifts
  the limit and says at every step that it trains on without CHAIR scores.

A caption the service answered with an error (e.g. an unknown image id) is not a fallback: it is
counted in `chair/error_samples`.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OPTIONAL_ENV",
    "SETTING",
    "ChairFallbackError",
    "Verdict",
    "chair_optional",
    "judge",
    "service_url",
]

SETTING = "algorithm.chair_fallback.max_fraction"
OPTIONAL_ENV = "CHAIR_OPTIONAL"


class ChairFallbackError(RuntimeError):
    """The run stopped because too many of a step's samples had no CHAIR score."""


@dataclass(frozen=True)
class Verdict:
    """One step's judgement: at most one of a warning, a notice (CHAIR_OPTIONAL=1) or a stop."""

    fallbacks: int
    samples: int
    warning: str | None = None
    notice: str | None = None
    stop: str | None = None

    def apply(self) -> None:
        """Print the step's line on the driver's stderr; raise `ChairFallbackError` to stop."""
        if self.stop:
            print(f"entropyrl: {self.stop}", file=sys.stderr, flush=True)
            raise ChairFallbackError(self.stop)
        if self.warning:
            print(f"entropyrl: warning: {self.warning}", file=sys.stderr, flush=True)
        elif self.notice:
            print(f"entropyrl: {self.notice}", file=sys.stderr, flush=True)


def service_url(reward_kwargs: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str:
    """The CHAIR service the caption reward calls: `reward_kwargs.chair_url`, else the variable
    the reward reads (`entropyrl.verl.rewards.CHAIR_URL_ENV`)."""
    from entropyrl.verl.rewards import CHAIR_URL_ENV

    url = (reward_kwargs or {}).get("chair_url") or environ.get(CHAIR_URL_ENV)
    return str(url) if url else f"(no URL: reward_kwargs.chair_url and ${CHAIR_URL_ENV} unset)"


def _node(rows: list[dict[str, Any]], driver: str) -> str:
    nodes = sorted({str(row["node"]) for row in rows if row.get("node")})
    if nodes:
        return "node " + ", ".join(nodes[:3]) + (" and others" if len(nodes) > 3 else "")
    return f"node {driver} (the driver's; the reward did not report its worker's)"


def chair_optional(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user chose to train on without CHAIR: `CHAIR_OPTIONAL=1` in `environ`
    (default: the process's)."""
    return (os.environ if environ is None else environ).get(OPTIONAL_ENV, "") == "1"


def judge(
    *,
    where: str,
    fallback_rows: list[dict[str, Any]],
    samples: int,
    max_fraction: float,
    url: str,
    environ: Mapping[str, str] | None = None,
    driver: str | None = None,
) -> Verdict:
    """Judge one step: `fallback_rows` are the reward infos of its real rows without a CHAIR
    answer (`entropyrl.verl.hooks.chair_fallback_rows`; a `node` key names the reward worker's
    host where the reward reports it), `samples` its real rows that report CHAIR, `url` the
    service. `environ` (default: the process's) holds `CHAIR_OPTIONAL`; `driver` is this host."""
    fallbacks = len(fallback_rows)
    if samples <= 0:
        return Verdict(fallbacks, samples)
    node = _node(fallback_rows, driver or socket.gethostname())
    share = f"{fallbacks} of {samples} samples got no CHAIR score"
    if chair_optional(environ):
        about = f" from the CHAIR service at {url} ({node})" if fallbacks else ""
        return Verdict(
            fallbacks,
            samples,
            notice=f"{where}: training on without CHAIR ({OPTIONAL_ENV}=1 lifts {SETTING}): "
            f"{share}{about}; those take the neutral clip bound and no CHAIR penalty",
        )
    allowed = math.floor(max_fraction * samples + 1e-9)
    if fallbacks > allowed:
        return Verdict(
            fallbacks,
            samples,
            stop=f"{where}: {share}, more than {SETTING}={max_fraction:g} allows ({allowed}): "
            f"the CHAIR service at {url} did not answer the reward on {node}; start it or make "
            f"it reachable from there, raise the limit, or set {OPTIONAL_ENV}=1 to train on "
            "without CHAIR",
        )
    if fallbacks:
        return Verdict(
            fallbacks,
            samples,
            warning=f"{where}: {share} from the CHAIR service at {url} ({node}); they train "
            f"with the neutral clip bound and no CHAIR penalty ({SETTING}={max_fraction:g} "
            f"allows {allowed})",
        )
    return Verdict(fallbacks, samples)
