"""Flask application factory of the CHAIR service (served by waitress, see ``__main__``)."""

from __future__ import annotations

import hmac
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import BadRequest, HTTPException, RequestEntityTooLarge

from chair_server import __version__, contract, strict_json, vocabulary
from chair_server.config import ServerSettings
from chair_server.scorer import ChairScorer, CorpusMetrics

log = logging.getLogger("chair_server")

# seconds a scoring request waits for a free slot before the 503 answer
SLOT_WAIT = 2.0


# The first route, EntropyRL's own: its forms still answer, marked deprecated (RFC 9745) with
# its successor (RFC 8288 `Link`); removed in 0.4.
LEGACY_ROUTE = "/computeCaption"
LEGACY_HEADERS = {"Deprecation": "true", "Link": '</v1/chair>; rel="successor-version"'}


def _validate_items(items: object, where: str, max_batch: int) -> list[Mapping[str, Any]]:
    """The request's captions by the one contract both sides use (`chair_server.contract`)."""
    try:
        return contract.check_items(items, where, max_batch)
    except contract.TooManyCaptions as error:
        raise RequestEntityTooLarge(str(error)) from None
    except contract.RequestError as error:
        raise BadRequest(str(error)) from None


def _json_body() -> object:
    raw = request.get_data(cache=False)
    if not raw.strip():
        raise BadRequest('body is empty: send a JSON object {"captions": [...]}')
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"body: not UTF-8 (byte {exc.start} is 0x{raw[exc.start]:02x}); send JSON as UTF-8"
        ) from exc
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise BadRequest("body: JSON nested too deeply") from exc
    except ValueError as exc:  # malformed JSON, an integer literal of 4300+ digits
        if "int_max_str_digits" in str(exc) or "integer string conversion" in str(exc):
            # Python's message advises sys.set_int_max_str_digits(): not the client's to act on
            raise BadRequest(
                f"body: a number with more than {sys.get_int_max_str_digits()} digits"
            ) from exc
        raise BadRequest(f"body: malformed JSON ({exc})") from exc


def _bearer(header: str) -> str:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive, RFC 7235)."""
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _printable(text: str) -> str:
    """Control and non-ASCII characters escaped, so a request path cannot forge log lines."""
    return text.encode("unicode_escape").decode("ascii")


def _stream(
    scorer: ChairScorer, items: list[Mapping[str, Any]], include_captions: bool
) -> Generator[bytes, None, None]:
    """The answer JSON in pieces of about 64 KiB: one sentence entry in memory at a time."""
    metrics = CorpusMetrics()
    pending = [b'{"sentences":[']
    size = 0
    for index, entry in enumerate(scorer.iter_score(items)):
        metrics.add(entry)
        if not include_captions:
            entry.pop("caption", None)
        piece = (b"," if index else b"") + strict_json.dumps(entry, separators=(",", ":")).encode()
        pending.append(piece)
        size += len(piece)
        if size >= 1 << 16:
            yield b"".join(pending)
            pending, size = [], 0
    overall = strict_json.dumps(metrics.result(), separators=(",", ":")).encode()
    pending.append(b'],"overall_metrics":' + overall + b"}")
    yield b"".join(pending)


def create_app(scorer: ChairScorer, settings: ServerSettings | None = None) -> Flask:
    """The WSGI app: ``POST /v1/chair``, ``GET /health``, ``GET /v1/info``; and the deprecated
    ``POST /computeCaption`` (`LEGACY_ROUTE`).

    ``POST /v1/chair`` takes ``{"captions": [{"image_id", "caption"}...], "include_captions":
    true}``; with ``include_captions: false`` the sentences leave out the caption text (the
    caller has it; this halves the answer).

    Errors are JSON ``{"error": "..."}``: 400 for malformed JSON or bad fields (named), 401
    without the bearer token (when one is set; /health stays open for launchers), 405 with
    ``Allow``, 413 for a body over ``max_body_mb`` or more than ``max_batch`` captions, 503 when
    every scoring slot stayed busy for ``SLOT_WAIT`` seconds (retry).

    Answers to scoring requests are streamed sentence by sentence, and at most ``workers - 1``
    requests score at once, so one worker thread is always free for ``/health``.
    """
    settings = settings or ServerSettings(ground_truth="<in-memory>")
    scorer.max_caption_chars = settings.max_caption_chars
    app = Flask("chair_server")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    token = settings.token
    categories = list(vocabulary.CATEGORY_NAMES)
    slots = threading.BoundedSemaphore(max(1, settings.workers - 1))

    @app.before_request
    def _start() -> Response | None:
        g.started = time.perf_counter()
        g.count = 0
        if token and request.path != "/health":
            given = _bearer(request.headers.get("Authorization", ""))
            if not hmac.compare_digest(given.encode(), token.encode()):
                response = _error(401, "missing or wrong bearer token (Authorization: Bearer ...)")
                response.headers["WWW-Authenticate"] = 'Bearer realm="chair_server"'  # RFC 6750
                return response
        return None

    @app.after_request
    def _access_log(response: Response) -> Response:
        elapsed = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        refused = ""
        if response.status_code >= 400 and response.is_json and not response.is_streamed:
            # why it was refused: the error names a field, never a caption's text
            refused = " refused: " + _printable(str((response.get_json() or {}).get("error", "")))
        log.info(
            "%s %s %d captions=%d %.1fms%s",
            _printable(request.method),
            _printable(request.path),
            response.status_code,
            g.get("count", 0),
            elapsed,
            refused,
        )
        return response

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        # werkzeug's own (a 405, a body over MAX_CONTENT_LENGTH) keep their class description;
        # ours (raised as BadRequest, RequestEntityTooLarge) carry the line naming the field
        message = exc.description or exc.name
        if exc.code == 413 and message == RequestEntityTooLarge.description:
            message = f"request body over the limit of {settings.max_body_mb:g} MiB"
        response = _error(exc.code or 500, message)
        for name, value in exc.get_headers():
            if name.lower() != "content-type":  # e.g. Allow on 405
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    def _internal(exc: Exception) -> Response:
        log.exception("internal error")
        return _error(500, f"internal error: {type(exc).__name__}")

    @app.get("/health")
    def health() -> Response:
        return jsonify(status="ok", images=scorer.num_images)

    @app.get("/v1/info")
    def info() -> Response:
        return jsonify(
            version=__version__,
            vocabulary=vocabulary.fingerprint(),
            categories=categories,
            num_categories=len(categories),
            images=scorer.num_images,
            source=scorer.source,
            max_batch=settings.max_batch,
            max_body_bytes=settings.max_body_bytes,
        )

    def _score(items: list[Mapping[str, Any]], include_captions: bool = True) -> Response:
        g.count = len(items)
        if not slots.acquire(timeout=SLOT_WAIT):
            response = _error(503, "busy: every scoring slot is taken, retry shortly")
            response.headers["Retry-After"] = "1"
            return response
        body = _SlotStream(_stream(scorer, items, include_captions), slots.release)
        return Response(body, status=200, mimetype="application/json")

    @app.post("/v1/chair")
    def chair() -> Response:
        body = _json_body()
        if not isinstance(body, dict):
            raise BadRequest('body must be an object {"captions": [...]}')
        try:
            contract.check_body_keys(body)
        except contract.RequestError as error:
            raise BadRequest(str(error)) from None
        if "captions" not in body:
            raise BadRequest("captions is missing")
        include = body.get("include_captions", True)
        if not isinstance(include, bool):
            raise BadRequest("include_captions must be a boolean")
        items = _validate_items(body["captions"], "captions", settings.max_batch)
        return _score(items, include)

    @app.post(LEGACY_ROUTE)
    def compute_caption() -> Response:
        # EntropyRL's request forms: a list, {"captions": [...]}, or one {caption, image_id}.
        body = _json_body()
        if isinstance(body, dict) and "captions" in body:
            items = _validate_items(body["captions"], "captions", settings.max_batch)
        elif isinstance(body, dict):
            items = _validate_items([body], "body", settings.max_batch)
        else:
            items = _validate_items(body, "body", settings.max_batch)
        return _score(items)

    @app.after_request
    def _legacy_headers(response: Response) -> Response:
        if request.path == LEGACY_ROUTE:  # its refusals too: the caller learns either way
            response.headers.update(LEGACY_HEADERS)
        return response

    return app


class _SlotStream:
    """A streamed answer that gives its scoring slot back when the server closes it (after
    the last piece, or when the client went away), even if it was never iterated."""

    def __init__(self, pieces: Generator[bytes, None, None], release: Callable[[], None]) -> None:
        self._pieces = pieces
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces

    def close(self) -> None:
        self._pieces.close()
        release, self._release = self._release, None
        if release is not None:
            release()


def _error(status: int, message: str) -> Response:
    response = jsonify(error=message)
    response.status_code = status
    return response
