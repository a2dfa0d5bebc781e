"""The two late stops checked early (`entropyrl.verl.checks.inputs_extra`), on real folders: a
tokenizer saved by transformers without its chat template, and W&B credentials (the environment
and a real netrc file)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from entropyrl.verl.checks.inputs_extra import chat_template_findings, logger_findings


def _config(model: Path | str, logger=("console", "file"), tokenizer_path=None):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": str(model), "tokenizer_path": tokenizer_path}},
            "trainer": {"logger": list(logger) if not isinstance(logger, str) else logger},
        }
    )


def _saved_tokenizer(tokenizer, folder: Path, template: bool) -> Path:
    """A tokenizer folder as `save_pretrained` writes it, with or without its chat template."""
    tokenizer = copy.deepcopy(tokenizer)
    if not template:
        tokenizer.chat_template = None
    tokenizer.save_pretrained(str(folder))
    return folder


def _transformers_can_chat(folder: Path) -> bool:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False
        )
    except ValueError:
        return False
    return True


def test_a_tokenizer_without_a_template_would_stop(small_tokenizer, tmp_path) -> None:
    folder = _saved_tokenizer(small_tokenizer, tmp_path / "base", template=False)
    assert not _transformers_can_chat(folder)  # what verl would meet at the first prompt
    (finding,) = chat_template_findings(_config(folder))
    assert (finding.check, finding.ok, finding.blocking) == ("inputs", False, True)
    assert finding.line.startswith(f"chat template: {folder} has none")
    assert f"copy its chat_template.jinja into {folder}" in finding.line
    assert "\n" not in finding.line


def test_a_saved_template_passes_wherever_transformers_keeps_it(small_tokenizer, tmp_path) -> None:
    folder = _saved_tokenizer(small_tokenizer, tmp_path / "instruct", template=True)
    assert _transformers_can_chat(folder)
    (finding,) = chat_template_findings(_config(folder))
    assert finding.ok and finding.line.startswith(f"chat template: {folder}: ")
    # the template as a key of tokenizer_config.json instead of its own file
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file():
            template = (folder / name).read_text()
            (folder / name).unlink()
    settings_file = folder / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text())
    settings["chat_template"] = template
    settings_file.write_text(json.dumps(settings))
    assert _transformers_can_chat(folder)
    (finding,) = chat_template_findings(_config(folder))
    assert finding.ok and finding.line.endswith("tokenizer_config.json (chat_template)")


def test_the_tokenizer_path_is_the_folder_checked(small_tokenizer, tmp_path) -> None:
    bare = _saved_tokenizer(small_tokenizer, tmp_path / "bare", template=False)
    chat = _saved_tokenizer(small_tokenizer, tmp_path / "chat", template=True)
    assert chat_template_findings(_config(bare, tokenizer_path=str(chat)))[0].ok
    assert not chat_template_findings(_config(chat, tokenizer_path=str(bare)))[0].ok


def test_a_model_that_is_not_here_is_left_to_the_inputs_check(tmp_path) -> None:
    assert chat_template_findings(_config(tmp_path / "missing")) == []
    assert chat_template_findings(_config("no-such-org/no-such-model-here")) == []


def test_wandb_without_credentials_would_stop(tmp_path) -> None:
    home = {"HOME": str(tmp_path)}
    (finding,) = logger_findings(_config("m", ["console", "wandb"]), home)
    assert (finding.check, finding.ok) == ("config", False)
    assert finding.line.startswith("trainer.logger has wandb but WANDB_API_KEY is not set")
    assert "export WANDB_API_KEY=" in finding.line and "drop wandb" in finding.line
    assert not logger_findings(_config("m", "wandb"), home)[0].ok  # a single string too


@pytest.mark.parametrize(
    ("environ", "source"),
    [
        ({"WANDB_API_KEY": "k"}, "WANDB_API_KEY"),
        ({"WANDB_MODE": "offline"}, "WANDB_MODE=offline, no key needed"),
    ],
)
def test_wandb_with_a_key_or_without_the_service_passes(tmp_path, environ, source) -> None:
    (finding,) = logger_findings(_config("m", ["wandb"]), {"HOME": str(tmp_path), **environ})
    assert finding.ok and finding.line == f"wandb logger: {source}"


def test_a_netrc_entry_for_wandb_passes(tmp_path) -> None:
    netrc_file = tmp_path / ".netrc"
    netrc_file.write_text("machine example.org\n  login a\n  password b\n")
    netrc_file.chmod(0o600)
    home = {"HOME": str(tmp_path)}
    assert not logger_findings(_config("m", ["wandb"]), home)[0].ok  # another host's entry
    netrc_file.write_text(
        netrc_file.read_text() + "machine api.wandb.ai\n  login user\n  password k\n"
    )
    (finding,) = logger_findings(_config("m", ["wandb"]), home)
    assert finding.ok and finding.line == "wandb logger: netrc entry for api.wandb.ai"
    # NETRC names another file
    assert not logger_findings(_config("m", ["wandb"]), {**home, "NETRC": str(tmp_path / "x")})[
        0
    ].ok


def test_no_wandb_no_finding(tmp_path) -> None:
    assert logger_findings(_config("m", ["console", "file"]), {"HOME": str(tmp_path)}) == []
