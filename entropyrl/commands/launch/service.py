"""The CHAIR service of a captioning run: its ground truth, started on a free port under its
supervisor (restarted on that port if it dies), its log in the run's folder, stopped on any exit;
on several nodes it listens where the other nodes reach it and wants a token."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from entropyrl.commands.launch.args import REWARD_KWARGS, Launch, override_value, say
from entropyrl.commands.launch.checks import require_file


def node_address() -> str:
    """This node's address as other nodes see it (the first that `hostname -I` lists)."""
    with contextlib.suppress(OSError):
        listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
        if listed:
            return listed[0]
    return socket.gethostbyname(socket.gethostname())


def loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


class ChairService:
    """The CHAIR service on a free port, supervised (restarted on that port if it dies), its
    output appended to `log`; `stop()` (SIGTERM to the supervisor) stops both."""

    def __init__(self, command: list[str], log: Path, ready_file: Path) -> None:
        self.command, self.log, self.ready_file = command, log, ready_file
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(self.log, "a") as handle:
            handle.write(f"== {stamp} {shlex.join(self.command)}\n")
            handle.flush()
            # the service's own output goes to its log; the supervisor's restart lines to stderr
            self.process = subprocess.Popen(self.command, stdout=handle)

    def wait_healthy(self, timeout: float) -> str | None:
        """The service's URL once it answers /health; None if it exited or `timeout` passed."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            url = self.url()
            if url and healthy(url):
                return url
            if self.process.poll() is not None or time.monotonic() >= deadline:
                return None
            time.sleep(1)

    def url(self) -> str:
        try:
            return self.ready_file.read_text().strip()
        except OSError:
            return ""

    def tail(self, lines: int = 5) -> None:
        with contextlib.suppress(OSError):
            say("\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=60)


def chair_source(launch: Launch, overrides: Sequence[str]) -> list[str]:
    """The CHAIR ground truth: CHAIR_COCO's annotations, else chair_ground_truth.json beside the
    CIDEr-D frequencies (`entropyrl prepare coco` writes both)."""
    coco = os.environ.get("CHAIR_COCO")
    if coco:
        if not Path(coco).is_dir():
            launch.fail(f"CHAIR_COCO={coco} is not a folder")
        return ["--coco", coco]
    cider = override_value(f"{REWARD_KWARGS}.cider_df", overrides)
    truth = str(Path(cider).parent / "chair_ground_truth.json")
    require_file(
        launch,
        truth,
        "CHAIR ground truth, written by entropyrl prepare coco (or set CHAIR_COCO)",
    )
    return ["--ground-truth", truth]


def start_chair(
    launch: Launch, source: list[str], values: dict[str, str], workdir: Path
) -> tuple[str, ChairService | None]:
    """The CHAIR service for this run, and the URL the reward gets. On one node it listens on
    the loopback; on several, the reward workers of every node must reach it: it listens on this
    node's address and wants the token from every client."""
    nodes = int(values.get("ER_NNODES") or 1)
    host = os.environ.get("CHAIR_HOST") or ("127.0.0.1" if nodes <= 1 else node_address())
    if not loopback(host) and not os.environ.get("CHAIR_SERVER_TOKEN"):
        launch.fail(
            f"the CHAIR service would listen on {host}, where other machines reach it ({nodes} "
            "node(s)), so it needs a token: export CHAIR_SERVER_TOKEN=<a secret> here and on "
            "every node before 'ray start' (the reward workers read it there)"
        )
    # The service's log stays in the run's folder (the checkpoint folder; a smoke's DIR),
    # appended to across resumes: what it said survives a crash.
    folder = launch.out if launch.smoke else (values.get("ER_CHECKPOINT_DIR") or ".")
    log = Path(folder) / "chair_server.log"
    command = [launch.python, "-m", "chair_server", *source, "--host", host, "--port", "0"]
    command += ["--ready-file", str(workdir / "url"), "--supervise"]
    if launch.dry_run:
        print(f"{shlex.join(command)} &", flush=True)
        return f"http://{host}:PORT", None  # the real port comes from the ready file
    service = ChairService(command, log, workdir / "url")
    service.start()
    timeout = float(os.environ.get("CHAIR_TIMEOUT") or 300)
    url = service.wait_healthy(timeout)
    if url:
        pid = service.process.pid if service.process else 0
        print(
            f"CHAIR service: {url} (supervisor pid {pid}: restarted on this port if it dies; "
            f"log: {log})",
            flush=True,
        )
        return url, service
    if os.environ.get("CHAIR_OPTIONAL") == "1":
        say(
            "warning: the CHAIR service did not come up (last lines of its log below); training "
            "continues without CHAIR scores (CHAIR_OPTIONAL=1): CIDEr-D reward only, neutral "
            "clip bounds, counted in chair/fallback_samples"
        )
        service.tail()
        # An address nothing listens on: the reward's client takes its documented fallback at
        # every batch, which the metrics count (the same path as a service that dies mid-run).
        return service.url() or "http://127.0.0.1:9", service
    service.tail()
    launch.fail(
        f"the CHAIR service did not come up within {timeout:g}s (the last lines of its log "
        "are above); CHAIR_OPTIONAL=1 trains without it (CIDEr-D reward only, neutral clip "
        "bounds, counted in chair/fallback_samples)"
    )
    return "", service
