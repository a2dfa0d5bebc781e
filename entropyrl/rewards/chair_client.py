"""HTTP client of the CHAIR service (``python -m chair_server``) for reward computation.

Stdlib only (urllib). One POST per chunk of ``max_batch`` captions; connection errors, time-outs
and 5xx answers are retried with exponential backoff inside a bounded total time. When the
service stays down the client returns ``None`` for those samples and counts them (the trainer
then uses its documented fallback), unless ``strict=True``, where it raises ChairServiceError.

A circuit breaker keeps a dead service from costing every batch its retries: after a failed
call the client stops calling for ``breaker_cooldown`` seconds (doubled after each failed probe,
up to ``breaker_max_cooldown``) and answers with the fallback at once; then one caller probes
``GET /health`` (half-open) and, when it answers, calls normally again. One WARNING line of the
``entropyrl.rewards.chair_client`` logger says when the service stops answering and one when it is back
(with Python's default logging that is a line on stderr; verl's workers log it).

``url`` may be a string or an object with a ``url`` attribute, read before every request: a
``chair_server.launch`` handle, whose URL changes when its supervisor restarts the service on
another port.

What ``score`` returns per sample, and how to tell the cases apart:

- a dict with ``"metrics"`` (``CHAIRs``, ``CHAIRi``, ``Recall``, ``mentions``, ...) and
  ``image_id``, ``mentioned``, ``hallucinated``, ``no_mentions`` (the caption text itself is not
  sent back): scored; ``mention_spans`` / ``hallucinated_spans`` say where each mention is in
  the caption sent (``chair_server.contract.spans`` reads them, None from a service without
  them);
- a dict with ``"error"`` (and no ``"metrics"``): the service answered but could not score this
  caption, e.g. an unknown image id; counted in ``chair/error_samples``;
- ``None``: the service could not be reached or answered badly; counted in
  ``chair/fallback_samples``. ``ChairClient.is_scored(entry)`` is True only for the first case.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from chair_server import contract

__all__ = ["ChairAuthError", "ChairClient", "ChairServiceError", "HasUrl"]

log = logging.getLogger("entropyrl.rewards.chair_client")


class HasUrl(Protocol):
    """Anything with the service's current base URL, e.g. a ``chair_server.launch`` handle."""

    url: str


def _check_url(url: str) -> None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {url!r}")


class ChairServiceError(RuntimeError):
    """The CHAIR service could not score a batch (raised only with ``strict=True``)."""


class ChairAuthError(ChairServiceError):
    """The service refused the token (HTTP 401 / 403). Raised whatever ``strict`` says: a
    missing or wrong token is a setup error that a fallback would only hide."""


class _Retryable(Exception):
    pass


class _Fatal(Exception):
    pass


class _TooLarge(_Fatal):
    """HTTP 413: the chunk is over the service's --max-batch or --max-body-mb."""


class ChairClient:
    """Batched, retrying client; counters are exposed through ``metrics()``.

    Args:
        url: service base URL, e.g. ``http://127.0.0.1:5000``, or an object whose ``url``
            attribute is read before every request (a ``chair_server.launch`` handle).
        timeout: seconds per HTTP request.
        retries: extra attempts per chunk after the first (connection errors, time-outs, 5xx).
        backoff: first retry delay in seconds, doubled on each further retry.
        token: bearer token when the service was started with ``--token``.
        max_batch: captions per HTTP request (larger inputs are chunked).
        strict: raise ChairServiceError instead of returning None for failed samples.
        total_timeout: upper bound in seconds on one ``score`` call's network time (default:
            enough for every attempt of one chunk). Once a chunk has failed, the remaining chunks
            of the call are not attempted, so a dead service costs at most this much per call.
        breaker_cooldown: seconds without calls after a failed call (None: no breaker, every
            call pays its retries; 0: probe ``/health`` at every call while down).
        breaker_max_cooldown: cap of the cooldown, which doubles after each failed probe
            (default: 60 s, or ``breaker_cooldown`` when that is longer).
        probe_timeout: seconds the half-open ``/health`` probe may take.
    """

    def __init__(
        self,
        url: str | HasUrl,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        max_batch: int = 512,
        strict: bool = False,
        total_timeout: float | None = None,
        breaker_cooldown: float | None = 5.0,
        breaker_max_cooldown: float | None = None,
        probe_timeout: float = 2.0,
    ) -> None:
        self._source: HasUrl | None = None if isinstance(url, str) else url
        self._url = ""
        if self._source is None:
            self.url = url  # type: ignore[assignment]
        else:
            _check_url(self._source.url)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("retries must be >= 0, timeout > 0 and backoff >= 0")
        if breaker_cooldown is not None and not breaker_cooldown >= 0:
            raise ValueError(f"breaker_cooldown must be None or >= 0, got {breaker_cooldown}")
        if breaker_max_cooldown is None:
            breaker_max_cooldown = max(60.0, breaker_cooldown or 0.0)
        if not breaker_max_cooldown >= (breaker_cooldown or 0) or not probe_timeout > 0:
            raise ValueError("breaker_max_cooldown must be >= breaker_cooldown, probe_timeout > 0")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.token = token
        self.max_batch = max_batch
        self.strict = strict
        if total_timeout is None:
            total_timeout = timeout * (retries + 1) + backoff * (2**retries - 1)
        self.total_timeout = total_timeout
        self.breaker_cooldown = breaker_cooldown
        self.breaker_max_cooldown = breaker_max_cooldown
        self.probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            (
                "requests",
                "retries",
                "failures",
                "scored_samples",
                "error_samples",
                "fallback_samples",
                "invalid_samples",
                "splits",
                "outages",
                "skipped_calls",
            ),
            0,
        )
        # breaker state, under _lock: down since (monotonic) / None when answering, next probe
        # time, the cooldown now in force, whether a caller is probing, the last failure
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._cooldown = breaker_cooldown or 0.0
        self._probing = False
        self._last_failure = ""
        self._fallback_at_outage = 0

    @property
    def url(self) -> str:
        """The base URL requests go to now (read from the handle when built from one)."""
        if self._source is not None:
            return self._source.url.rstrip("/")
        return self._url

    @url.setter
    def url(self, value: str) -> None:
        _check_url(value)
        self._source = None
        self._url = value.rstrip("/")

    # circuit breaker --------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """False from a failed call until the service answers again."""
        with self._lock:
            return self._down_since is None

    def _gate(self) -> str:
        """``"call"``, ``"probe"`` (half-open: this caller checks /health first) or ``"skip"``."""
        with self._lock:
            if self._down_since is None or self.breaker_cooldown is None:
                return "call"
            if self._probing or time.monotonic() < self._retry_at:
                return "skip"
            self._probing = True
            return "probe"

    def _failed(self, reason: str, samples: int = 0) -> None:
        """A call (or probe) failed, its ``samples`` fell back: open the circuit; one line when
        the service was up."""
        with self._lock:
            self._probing = False
            self._last_failure = reason
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
                self._cooldown = self.breaker_cooldown or 0.0
                self._counts["outages"] += 1
                self._fallback_at_outage = self._counts["fallback_samples"] - samples
                announce = True
            else:
                self._cooldown = min(self.breaker_max_cooldown, max(self._cooldown * 2, 0.0))
                announce = False
            self._retry_at = now + self._cooldown
            cooldown = self._cooldown
        if announce:
            then = (
                f"calls resume after a /health probe in {cooldown:g} s"
                if self.breaker_cooldown is not None
                else "every call retries"
            )
            log.warning(
                "CHAIR service at %s stopped answering (%s): its samples take the fallback "
                "(no CHAIR score, neutral clip bound); %s",
                self.url,
                reason,
                then,
            )

    def _answered(self) -> None:
        """The service answered: close the circuit; one line when it was down."""
        with self._lock:
            self._probing = False
            down_since, self._down_since = self._down_since, None
            fell_back = self._counts["fallback_samples"] - self._fallback_at_outage
        if down_since is not None:
            log.warning(
                "CHAIR service at %s answers again after %.1f s (%d samples fell back meanwhile)",
                self.url,
                time.monotonic() - down_since,
                fell_back,
            )

    def _skip(self, samples: int) -> None:
        self._count(skipped_calls=1, fallback_samples=samples)
        if self.strict:
            with self._lock:
                reason = self._last_failure
            raise ChairServiceError(
                f"CHAIR service at {self.url} is down ({reason}); not calling it until a probe "
                "of /health answers"
            )

    # counters ---------------------------------------------------------------------------
    def _count(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                self._counts[key] += value

    @property
    def stats(self) -> dict[str, int]:
        """Raw counters: requests, retries, failures (chunks), scored/error/fallback samples,
        invalid samples (ids the service would refuse), splits (chunks halved after 413),
        outages (times the service stopped answering) and skipped calls (answered with the
        fallback without a request while the circuit was open or its probe failed)."""
        with self._lock:
            return dict(self._counts)

    def metrics(self) -> dict[str, float]:
        """Counters under ``chair/...`` names for the trainer's metric logger."""
        return {f"chair/{key}": float(value) for key, value in self.stats.items()}

    @staticmethod
    def is_scored(entry: Mapping[str, Any] | None) -> bool:
        """True when ``entry`` carries metrics (not None, not a per-caption error)."""
        return entry is not None and "metrics" in entry

    # HTTP -------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _post(self, payload: bytes, timeout: float) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + "/v1/chair", data=payload, headers=self._headers(), method="POST"
        )
        self._count(requests=1)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode("utf-8", "replace")
            if exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {detail}") from exc
            if exc.code == 413:
                raise _TooLarge(f"HTTP 413: {detail}") from exc
            if exc.code in (401, 403):
                raise ChairAuthError(
                    f"the CHAIR service at {self.url} refused this client's token (HTTP "
                    f"{exc.code}): set CHAIR_SERVER_TOKEN to the service's token where the "
                    "reward runs (on every node, before `ray start`)"
                ) from exc
            raise _Fatal(f"HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # refused/reset connections, time-outs, truncated answers: all worth a retry
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise _Retryable(f"malformed JSON answer: {exc}") from exc

    def _score_chunk(self, chunk: list[dict[str, Any]], deadline: float) -> list[dict[str, Any]]:
        # the caller already holds the captions: the service need not send them back
        body = {"captions": chunk, "include_captions": False}
        payload = json.dumps(body, separators=(",", ":")).encode()
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Fatal("total time budget spent")
            try:
                answer = self._post(payload, min(self.timeout, remaining))
                sentences = answer.get("sentences") if isinstance(answer, dict) else None
                if not isinstance(sentences, list) or len(sentences) != len(chunk):
                    raise _Fatal("answer has no 'sentences' list of the request's length")
                return sentences
            except _Retryable as exc:
                if attempt >= self.retries:
                    raise _Fatal(f"{exc} (after {attempt + 1} attempts)") from exc
                delay = self.backoff * 2**attempt
                if time.monotonic() + delay >= deadline:
                    raise _Fatal(f"{exc} (time budget spent)") from exc
                self._count(retries=1)
                time.sleep(delay)
                attempt += 1

    def score(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        """Per-sample service entries in input order; None where the service failed.

        ``items`` are ``{"image_id": int | str, "caption": str}`` mappings (ValueError naming
        the field otherwise). Integer ids of other types (numpy) are sent as ints. An id the
        service would refuse (a float, None, a bool, a list) makes only that sample None,
        counted in ``chair/invalid_samples`` and ``chair/fallback_samples`` (ValueError with
        ``strict=True``), instead of failing its whole chunk. A 413 answer (a chunk over the
        service's ``--max-batch`` or ``--max-body-mb``) splits the chunk in halves and sends
        them again; a single caption still refused falls back alone. See the module docstring
        for telling results apart.
        """
        captions: list[dict[str, Any]] = []
        positions: list[int] = []
        for i, item in enumerate(items):
            problem = contract.item_problem(item, f"items[{i}]")  # the service's own rules
            if problem is not None and (problem.field != "image_id" or self.strict):
                raise ValueError(problem.message)
            if problem is not None:  # an id the service would refuse: this sample alone
                self._count(invalid_samples=1, fallback_samples=1)
                continue
            captions.append(
                {"image_id": contract.image_id(item["image_id"]), "caption": item["caption"]}
            )
            positions.append(i)
        results: list[dict[str, Any] | None] = [None] * len(items)
        if not captions:
            return results
        gate = self._gate()
        try:
            return self._score_items(captions, positions, results, gate)
        finally:
            if gate == "probe":  # whatever happened, the next caller may probe again
                with self._lock:
                    self._probing = False

    def _score_items(
        self,
        captions: list[dict[str, Any]],
        positions: list[int],
        results: list[dict[str, Any] | None],
        gate: str,
    ) -> list[dict[str, Any] | None]:
        if gate == "skip":
            self._skip(len(captions))
            return results
        if gate == "probe" and not self.health(timeout=min(self.timeout, self.probe_timeout)):
            self._failed("no answer to the /health probe")
            self._skip(len(captions))
            return results
        deadline = time.monotonic() + self.total_timeout
        failure: str | None = None
        lost = 0  # samples of chunks that failed or were not attempted after a failure
        for start in range(0, len(captions), self.max_batch):
            chunk = captions[start : start + self.max_batch]
            if failure is None:
                try:
                    sentences = self._score_splitting(chunk, deadline)
                except _Fatal as exc:
                    failure = str(exc)
                else:
                    for offset, sentence in enumerate(sentences):
                        results[positions[start + offset]] = sentence
                    refused = sentences.count(None)
                    errors = sum(1 for s in sentences if s is not None and "error" in s)
                    self._count(
                        scored_samples=len(chunk) - errors - refused,
                        error_samples=errors,
                        failures=refused,
                        fallback_samples=refused,
                    )
                    continue
            self._count(failures=1, fallback_samples=len(chunk))
            lost += len(chunk)
        if failure is None:
            self._answered()
        else:
            self._failed(failure, lost)
            if self.strict:
                raise ChairServiceError(f"CHAIR service at {self.url} failed: {failure}")
        return results

    def _score_splitting(
        self, chunk: list[dict[str, Any]], deadline: float
    ) -> list[dict[str, Any] | None]:
        """Entries of a chunk; on 413 the two halves are sent on their own (recursively)."""
        try:
            return list(self._score_chunk(chunk, deadline))
        except _TooLarge:
            if len(chunk) == 1:
                if self.strict:
                    raise
                return [None]
        middle = len(chunk) // 2
        self._count(splits=1)
        first = self._score_splitting(chunk[:middle], deadline)
        return first + self._score_splitting(chunk[middle:], deadline)

    def health(self, timeout: float | None = None) -> bool:
        """One ``GET /health``; True when the service answers 200."""
        try:
            with urllib.request.urlopen(
                urllib.request.Request(self.url + "/health", headers=self._headers()),
                timeout=timeout or self.timeout,
            ) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            return False

    def wait_until_healthy(self, timeout: float = 30.0) -> bool:
        """Poll ``/health`` until it answers or ``timeout`` s pass (raises in strict mode).

        An answer closes the circuit breaker: the next ``score`` call goes out at once.
        """
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if self.health(timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                self._answered()
                return True
            if time.monotonic() + delay > deadline:
                if self.strict:
                    raise ChairServiceError(
                        f"CHAIR service at {self.url} not healthy after {timeout}s"
                    )
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
