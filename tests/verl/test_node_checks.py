"""Every node checks, as a Ray task, what the run reads there (entropyrl.verl.checks.nodes):
the data files, one image, the model folder and the CHAIR service with the run's token, against
a real service over HTTP and a real (one-node) Ray cluster."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from chair_server.launch import start_server
from entropyrl.verl.checks import nodes as node_checks
from entropyrl.verl.checks.nodes import NodeInputs, node_problems

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def token_service(tmp_path_factory):
    ground_truth = tmp_path_factory.mktemp("chair") / "gt.json"
    ground_truth.write_text(json.dumps({"1": ["dog"]}))
    with start_server(ground_truth=ground_truth, extra_args=["--token", TOKEN]) as server:
        yield server.url


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # bound and released: nothing listens there


def _run(tmp_path: Path, *, images: bool = True) -> tuple[object, Path, Path]:
    """A run's files: train/val parquet whose first row names an image, and a model folder."""
    image = tmp_path / "images" / "1.jpg"
    image.parent.mkdir()
    image.write_bytes(b"\xff\xd8\xff")
    rows = {"prompt": ["p"], "images": [[str(image)]] if images else [[]]}
    for split in ("train", "val"):
        pq.write_table(pa.table(rows), tmp_path / f"{split}.parquet")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = OmegaConf.create(
        {
            "data": {
                "train_files": str(tmp_path / "train.parquet"),
                "val_files": [str(tmp_path / "val.parquet")],
            },
            "actor_rollout_ref": {"model": {"path": str(model)}},
            "reward": {"custom_reward_function": {"reward_kwargs": {"chair_url": None}}},
        }
    )
    return config, image, model


def test_inputs_from_config_name_the_data_one_image_the_model_and_chair(tmp_path):
    config, image, model = _run(tmp_path)
    config.reward.custom_reward_function.reward_kwargs.chair_url = "http://10.0.0.1:5000"
    inputs = node_checks.inputs_from_config(config, environ={})
    assert inputs == NodeInputs(
        files=(str(tmp_path / "train.parquet"), str(tmp_path / "val.parquet"), str(image)),
        model=str(model),
        chair_url="http://10.0.0.1:5000",
        token=None,  # each node sends its own
    )
    # CHAIR_OPTIONAL=1: training on without CHAIR is the user's choice, counted per step
    assert node_checks.inputs_from_config(config, environ={"CHAIR_OPTIONAL": "1"}) == replace(
        inputs, chair_url=None
    )
    (tmp_path / "text").mkdir()
    config, _, _ = _run(tmp_path / "text", images=False)
    assert node_checks.inputs_from_config(config, environ={}).chair_url is None
    assert len(node_checks.inputs_from_config(config).files) == 2  # no image rows


def test_a_node_with_everything_has_no_problem(tmp_path, token_service):
    config, _, _ = _run(tmp_path)
    config.reward.custom_reward_function.reward_kwargs.chair_url = token_service
    inputs = replace(node_checks.inputs_from_config(config), token=TOKEN)
    assert node_problems(inputs) == []


def test_each_missing_input_is_one_phrase(tmp_path, token_service):
    config, image, model = _run(tmp_path)
    image.unlink()
    (model / "config.json").unlink()
    inputs = node_checks.inputs_from_config(config)
    assert node_problems(inputs) == [
        f"no file {image}",
        f"no model folder {model} (config.json)",
    ]


def test_chair_refusing_the_token_and_chair_out_of_reach_are_told_apart(token_service):
    wrong = node_problems(NodeInputs(chair_url=token_service, token="wrong"))
    assert wrong == [
        f"the CHAIR service at {token_service} refuses the run's token (HTTP 401): set "
        "CHAIR_SERVER_TOKEN to the service's token on this node (before `ray start`)"
    ]
    assert node_problems(NodeInputs(chair_url=token_service, token=None))[0].endswith(
        "set CHAIR_SERVER_TOKEN to the service's token on this node (before `ray start`)"
    )
    closed = _closed_port_url()
    (unreachable,) = node_problems(NodeInputs(chair_url=closed, token=TOKEN), timeout=5)
    assert unreachable.startswith(f"the CHAIR service at {closed} is out of reach from this node (")


@pytest.mark.ray
def test_every_node_checks_as_a_ray_task_and_the_stop_names_the_node(
    tmp_path, token_service, monkeypatch, capsys
):
    import ray

    monkeypatch.setenv("CHAIR_SERVER_TOKEN", TOKEN)

    config, image, _ = _run(tmp_path)
    config.reward.custom_reward_function.reward_kwargs.chair_url = token_service
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        node_checks.require_every_node(config)  # nothing missing: passes
        image.unlink()
        monkeypatch.setenv("CHAIR_SERVER_TOKEN", "wrong")  # the driver's, not the node's
        with pytest.raises(node_checks.NodeCheckError) as stop:
            node_checks.require_every_node(config)
        address = ray.nodes()[0]["NodeManagerAddress"]
    finally:
        ray.shutdown()
    line = (
        "a node lacks what the run reads there (data, images and the model must be at the same "
        "paths on every node, e.g. a shared file system, and the CHAIR service reachable from "
        f"each): node {address} ({socket.gethostname()}): no file {image}"
    )
    assert str(stop.value) == line
    assert capsys.readouterr().err.splitlines()[-1] == f"entropyrl: {line}"
