"""Reward failures, reported from the reward workers to the trainer.

In verl 0.9.1 a reward call that raises fails its agent-loop session: the sync trainer trains on
the rest of the group and pads the batch (`trainer_base._balance_batch`), and the exception
stays in a worker's log. Every reward entry point of ours (`entropyrl.verl.rewards`) is wrapped
in `reported`: a call that raises first records what it raised (its kind, its first line, the
node) in a book the trainer reads when it counts the samples a step received
(`entropyrl.verl.failures.lost_samples`), then raises as before. A response the scorer could not judge
(a math check that timed out, a code service that did not answer) arrives here as
`entropyrl.rewards.scorer.ScoringFailed`, raised by the entry point, and counts the same way.

The book is a named Ray actor of this job, made by the first failure: a run without failures
starts no process for it. Reporting never raises (the reward's own error is what matters), and
outside Ray (a reward called in-process) it only logs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["AUTH", "BOOK_NAME", "ERROR", "Failure", "drain", "report", "report_async", "reported"]

log = logging.getLogger("entropyrl.verl.failures.reward_failures")

BOOK_NAME = "entropyrl_reward_failures"
BOOK_NAMESPACE = "entropyrl"
AUTH = "auth"  # the CHAIR service refused the token: a setup error, the run stops at once
ERROR = "error"  # anything else a reward call raised
# Messages kept per kind in the book; later ones are counted under OTHER_MESSAGES.
_EXAMPLES_KEPT = 20
OTHER_MESSAGES = "(other messages)"
_REPORT_TIMEOUT_S = 30.0

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Failure:
    """One failed reward call: `kind` (AUTH or ERROR), its message, where it ran."""

    kind: str
    message: str
    node: str = ""

    def line(self) -> str:
        where = f" (node {self.node})" if self.node else ""
        return f"{self.message}{where}"


def kind_of(error: BaseException) -> str:
    from entropyrl.rewards.chair_client import ChairAuthError

    return AUTH if isinstance(error, ChairAuthError) else ERROR


def describe(error: BaseException) -> str:
    """The error's type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class _Book:
    """The job's record of failed reward calls (the body of the named actor)."""

    def __init__(self) -> None:
        self._failures: list[tuple[str, str, str, int]] = []

    def record(self, kind: str, message: str, node: str) -> None:
        known = [(k, m, n) for k, m, n, _ in self._failures]
        if (kind, message, node) not in known:
            if sum(1 for k, *_ in known if k == kind) >= _EXAMPLES_KEPT:
                message, node = OTHER_MESSAGES, ""
            if (kind, message, node) not in known:
                self._failures.append((kind, message, node, 0))
                known.append((kind, message, node))
        i = known.index((kind, message, node))
        k, m, n, count = self._failures[i]
        self._failures[i] = (k, m, n, count + 1)

    def drain(self) -> list[tuple[str, str, str, int]]:
        failures, self._failures = self._failures, []
        return failures


_book_handle: Any = None
_creating = threading.Lock()
_logged: set[tuple[str, str]] = set()  # each message once per process in the worker's log


def _book(create: bool) -> Any:
    """This job's book (None when Ray is not running here, or none exists and `create` is False)."""
    global _book_handle
    import ray

    if not ray.is_initialized():
        return None
    if _book_handle is not None:
        return _book_handle
    # One book per job, in a namespace of its own: the trainer's process finds it by name
    # wherever the reward worker that made it runs.
    name = f"{BOOK_NAME}-{ray.get_runtime_context().get_job_id()}"
    if create:
        actor = ray.remote(num_cpus=0)(_Book)
        options = {"name": name, "namespace": BOOK_NAMESPACE, "get_if_exists": True}
        with _creating:  # one handle per process: a second one's drop would end the actor
            if _book_handle is None:
                _book_handle = actor.options(**options).remote()
        return _book_handle
    try:
        return ray.get_actor(name, namespace=BOOK_NAMESPACE)
    except ValueError:  # no failure reported yet
        return None


def _send(error: BaseException) -> Any:
    """Log the failure here and send it to the job's book: the pending reference, or None."""
    failure = Failure(kind_of(error), describe(error))
    if (failure.kind, failure.message) not in _logged:
        _logged.add((failure.kind, failure.message))
        log.error("reward call failed: %s", failure.message, exc_info=error)
    try:
        import ray

        book = _book(create=True)
        if book is None:
            return None
        node = ray.util.get_node_ip_address()
        return book.record.remote(failure.kind, failure.message, node)
    except Exception as problem:  # the reward's own error is the one to raise
        log.error("could not report the failed reward call to the trainer: %r", problem)
        return None


def report(error: BaseException) -> None:
    """Record a failed reward call in the job's book (and the worker's log); never raises.
    Waited for: the trainer reads the book once the session has failed."""
    pending = _send(error)
    if pending is None:
        return
    try:
        import ray

        ray.get(pending, timeout=_REPORT_TIMEOUT_S)
    except Exception as problem:
        log.error("could not report the failed reward call to the trainer: %r", problem)


async def report_async(error: BaseException) -> None:
    """`report` for a coroutine on a Ray actor's event loop (awaits instead of blocking it)."""
    pending = await asyncio.get_running_loop().run_in_executor(None, _send, error)
    if pending is None:
        return
    try:
        await asyncio.wait_for(asyncio.wrap_future(pending.future()), _REPORT_TIMEOUT_S)
    except Exception as problem:
        log.error("could not report the failed reward call to the trainer: %r", problem)


def drain() -> list[tuple[Failure, int]]:
    """The failures reported since the last call, each with its count (the trainer's side)."""
    import ray

    book = _book(create=False)
    if book is None:
        return []
    entries = ray.get(book.drain.remote())
    return [(Failure(kind, message, node), count) for kind, message, node, count in entries]


def reported(function: F) -> F:
    """`function` (a reward entry point, sync or async) with every exception it raises reported
    (`report`) before it propagates; verl sees the same function, async when it was."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def async_reported(*args: Any, **kwargs: Any) -> Any:
            try:
                return await function(*args, **kwargs)
            except Exception as error:
                await report_async(error)
                raise

        return async_reported  # type: ignore[return-value]

    @functools.wraps(function)
    def sync_reported(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            report(error)
            raise

    return sync_reported  # type: ignore[return-value]
