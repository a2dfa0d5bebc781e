"""``python -m chair_server``: load the ground truth, then serve the app with waitress.

Prints ``CHAIR server listening on http://HOST:PORT`` (flushed) once the socket is bound and the
ground truth is loaded, and writes the URL to ``--ready-file`` when given, so launchers can use
``--port 0`` without port races.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

from waitress.server import create_server

from chair_server.app import create_app
from chair_server.config import ServerSettings, parse_args
from chair_server.scorer import ChairScorer


def load_scorer(settings: ServerSettings) -> ChairScorer:
    if settings.coco is not None:
        return ChairScorer.from_coco(settings.coco, cache_dir=settings.cache_dir)
    return ChairScorer.from_ground_truth(settings.ground_truth)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.perf_counter()
    try:
        scorer = load_scorer(settings)
    except (OSError, ValueError) as exc:
        print(f"chair_server: cannot load ground truth: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("chair_server").info(
        "ground truth: %d images from %s in %.1fs%s",
        scorer.num_images,
        scorer.source,
        time.perf_counter() - started,
        " (cache)" if scorer.loaded_from_cache else "",
    )
    app = create_app(scorer, settings)
    server = create_server(
        app,
        host=settings.host,
        port=settings.port,
        threads=settings.workers,
        # waitress's own cap sits above the app's so the app answers 413 as JSON
        max_request_body_size=2 * settings.max_body_bytes + (1 << 20),
        ident="chair_server",
    )
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    # a host name that resolves to several addresses gives one socket each (MultiSocketServer)
    port = getattr(server, "effective_port", None) or server.effective_listen[0][1]
    url = f"http://{host}:{port}"

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    if settings.ready_file:
        tmp = Path(settings.ready_file + ".tmp")
        tmp.write_text(url)
        os.replace(tmp, settings.ready_file)
    print(f"CHAIR server listening on {url}", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
