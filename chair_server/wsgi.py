"""The service under any standard WSGI server, beside the supervised `python -m chair_server`.

    CHAIR_SERVER_ARGS="--ground-truth data/coco/chair_ground_truth.json" \\
        waitress-serve --port 8000 --call chair_server.wsgi:create_app
    CHAIR_SERVER_ARGS="--coco annotations/" gunicorn -w 1 'chair_server.wsgi:create_app()'

`create_app()` takes no argument: the settings are `python -m chair_server`'s own flags, read
from `$CHAIR_SERVER_ARGS` and checked the same way (the token from `$CHAIR_SERVER_TOKEN`), and
the ground truth is loaded before the app is returned. The listening address, workers and
connection limits are the WSGI server's; `--host`, `--port` and `--workers` are ignored here
(`--workers` still sizes the scoring slots, keep it at the server's thread count).
"""

from __future__ import annotations

import os
import shlex

from flask import Flask

from chair_server.app import create_app as app_for
from chair_server.config import parse_args

ARGS_ENV = "CHAIR_SERVER_ARGS"


def create_app() -> Flask:
    """The WSGI app for the settings in `$CHAIR_SERVER_ARGS` (exit 2 with the reason if bad)."""
    from chair_server.__main__ import load_scorer

    settings = parse_args(shlex.split(os.environ.get(ARGS_ENV, "")))
    return app_for(load_scorer(settings), settings)
