"""The local session's CHAIR client follows the supervised service's handle, not a fixed URL."""

from __future__ import annotations


def test_session_client_reads_the_url_from_the_service_handle(tmp_path, entropyrl_cache):
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import CaptionSession

    cfg = DemoConfig(
        out=str(tmp_path / "out"), num_train=8, num_test=2, image_size=56, hidden_size=64,
        threads=1, progress=False,
    )  # fmt: skip
    with CaptionSession(cfg, tmp_path / "world") as session:
        first = session.server.url
        assert session.chair.url == first
        scored = session.chair.score([{"image_id": session.task.test_ids[0], "caption": "a cat"}])
        assert session.chair.is_scored(scored[0])
        # what the supervisor does when it restarts the service on another port
        session.server.url = "http://127.0.0.1:9"
        assert session.chair.url == "http://127.0.0.1:9"
        session.server.url = first
