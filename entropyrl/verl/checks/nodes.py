"""At start, every node of the Ray cluster checks what the run will read there.

verl's workers open the data files, the images and the model folder on the node they run on,
and the reward workers call the CHAIR service from theirs; the launch checks these on the
launching node only. A path that exists only there, or a service the other nodes cannot reach
(it listens on the first `hostname -I` address; a firewall, another network), fails later, in
a worker, with a traceback that does not name the node, or, for CHAIR, as fallbacks. So before
any worker starts the trainer runs one Ray task per alive node that checks:

- the data files (`data.train_files`, `data.val_files`) and the model folder (config.json);
- one image: the first image of the first training row (a folder copied partly fails here);
- the CHAIR service, when the reward asks for one: a request with the node's own
  `CHAIR_SERVER_TOKEN` (what its reward workers send), so that a refused token (401/403) is
  told apart from a service out of reach; not with `CHAIR_OPTIONAL=1`, where a run trains on
  without CHAIR by choice and each step counts and reports its fallbacks
  (`entropyrl.verl.failures.chair_fallback`);

and stops the run with one line per node that fails, naming the node and the fix.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from entropyrl.verl.checks.findings import select
from entropyrl.verl.failures.chair_fallback import chair_optional

TOKEN_ENV = "CHAIR_SERVER_TOKEN"
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"


class NodeCheckError(RuntimeError):
    """A node of the cluster lacks what the run reads there."""


@dataclass(frozen=True)
class NodeInputs:
    """What every node must reach: files, folders (with config.json), the CHAIR service."""

    files: tuple[str, ...] = ()
    model: str | None = None
    chair_url: str | None = None
    token: str | None = None


def node_problems(inputs: NodeInputs, timeout: float = 10.0) -> list[str]:
    """What this node lacks of `inputs`, one phrase each ([] when nothing)."""
    problems = [f"no file {path}" for path in inputs.files if not Path(path).is_file()]
    model = Path(inputs.model) if inputs.model else None
    if model is not None and model.is_absolute() and not (model / "config.json").is_file():
        problems.append(f"no model folder {inputs.model} (config.json)")
    if inputs.chair_url:
        problem = chair_problem(inputs.chair_url, inputs.token, timeout)
        if problem:
            problems.append(problem)
    return problems


def chair_problem(url: str, token: str | None, timeout: float) -> str | None:
    """Whether this node reaches the CHAIR service at `url` with `token`: an empty scoring
    request passes the service's token gate (401 without it) and is answered, 400 included."""
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/chair",
        data=json.dumps({"captions": []}).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return (
                f"the CHAIR service at {url} refuses the run's token (HTTP {error.code}): set "
                f"{TOKEN_ENV} to the service's token on this node (before `ray start`)"
            )
        return None  # answered: reached, token accepted
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return f"the CHAIR service at {url} is out of reach from this node ({reason})"


def first_image(train_file: str) -> str | None:
    """The first image path of the first row of a verl RLHF parquet (`images`), or None."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(train_file).read_row_group(0)
    except (OSError, ValueError):
        return None  # the file check says so
    if "images" not in table.column_names or table.num_rows == 0:
        return None
    images = table.column("images")[0].as_py() or []
    first = images[0] if images else None
    if isinstance(first, dict):
        first = first.get("image") or first.get("path")
    return first if isinstance(first, str) and not first.startswith("data:") else None


def inputs_from_config(config: Any, environ: Mapping[str, str] | None = None) -> NodeInputs:
    """The run's data files, one image, model folder and CHAIR service, from verl's config (the
    service left out under `CHAIR_OPTIONAL=1` in `environ`, default the process's). The token
    is left to each node: its reward workers send the `CHAIR_SERVER_TOKEN` of theirs."""
    files: list[str] = []
    for key in ("data.train_files", "data.val_files"):
        value = select(config, key, None)
        if value is None:
            continue
        paths = [value] if isinstance(value, str) else list(value)
        files += [str(path) for path in paths if str(path) and "://" not in str(path)]
    train = select(config, "data.train_files", None)
    train = train if isinstance(train, str) else (next(iter(train)) if train else None)
    if train and Path(str(train)).is_file():
        image = first_image(str(train))
        if image:
            files.append(image.removeprefix("file://"))
    chair_url = select(config, f"{REWARD_KWARGS}.chair_url", None)
    if chair_optional(environ):
        chair_url = None
    return NodeInputs(
        files=tuple(dict.fromkeys(files)),
        model=str(select(config, "actor_rollout_ref.model.path", "") or "") or None,
        chair_url=str(chair_url) if chair_url else None,
    )


def _node_task(inputs: NodeInputs) -> tuple[str, list[str]]:
    """On one node: its host name and problems, with the token its own workers would send."""
    if inputs.chair_url and inputs.token is None:
        inputs = replace(inputs, token=os.environ.get(TOKEN_ENV) or None)
    return socket.gethostname(), node_problems(inputs)


def check_every_node(inputs: NodeInputs) -> list[str]:
    """Run `node_problems` on every alive node of the Ray cluster this process is connected
    to; one line per node that lacks something: `node <address> (<host>): ...`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(_node_task)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    pending = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(inputs)
        for node in nodes
    ]
    lines = []
    for node, (host, problems) in zip(nodes, ray.get(pending)):
        if problems:
            address = node.get("NodeManagerAddress", "?")
            lines.append(f"node {address} ({host}): {'; '.join(problems)}")
    return lines


def require_every_node(config: Any) -> None:
    """Stop the run when a node lacks its inputs: the line on the driver's stderr (where the
    launch shows it last), then NodeCheckError with it."""
    lines = check_every_node(inputs_from_config(config))
    if lines:
        line = stop_line(lines)
        print(f"entropyrl: {line}", file=sys.stderr, flush=True)
        raise NodeCheckError(line)


def stop_line(lines: Sequence[str]) -> str:
    return (
        "a node lacks what the run reads there (data, images and the model must be at the same "
        "paths on every node, e.g. a shared file system, and the CHAIR service reachable from "
        "each): " + " | ".join(lines)
    )
