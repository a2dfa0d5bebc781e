"""`chair_server.options`, the one dataclass -> command line mechanism: the CHAIR service, the
demo, the study and the acceptance run build their options with it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from chair_server.options import OneLineParser, add_options, from_args, to_command_line


def _help(default, text, **more):
    return field(default=default, metadata={"help": text, **more})


@dataclass(frozen=True)
class Section:
    low: float = _help(0.3, "lower bound")
    rule: str = _help("binary", "how", choices=("binary", "linear"))


@dataclass
class Settings:
    steps: int = _help(10, "optimizer steps, 100% of them")
    name: str | None = _help(None, "a name")
    fast: bool = _help(False, "go fast")
    section: Section = field(default_factory=Section, metadata={"help": "a section", "spec": True})

    def __post_init__(self) -> None:  # a section comes as a mapping, as DemoConfig takes it
        if isinstance(self.section, dict):
            self.section = Section(**self.section)


def parser_for(cls=Settings, **options) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="prog")
    add_options(parser, cls, **options)
    return parser


def test_fields_become_options_with_types_defaults_and_sections() -> None:
    args = parser_for().parse_args(["--steps", "3", "--fast", "--section-low", "0.5"])
    settings = from_args(args, Settings)
    assert settings == Settings(steps=3, fast=True, section=Section(low=0.5))
    assert from_args(parser_for().parse_args([]), Settings) == Settings()
    assert from_args(parser_for().parse_args(["--no-fast"]), Settings).fast is False


def test_help_names_defaults_and_survives_a_percent_sign() -> None:
    text = parser_for().format_help()
    assert "optimizer steps, 100% of them (default: 10)" in text
    assert "--section-rule {binary,linear}" in text and "section (a section)" in text
    assert "(default:" not in parser_for(show_default=False).format_help()


def test_a_switch_and_a_required_choice_of_one(capsys) -> None:
    @dataclass
    class Service:
        coco: str | None = _help(None, "annotations")
        truth: str | None = _help(None, "a file")
        supervise: bool = _help(False, "restart it")

    parser = parser_for(Service, negatable=False, exclusive=("coco", "truth"))
    assert "--no-supervise" not in parser.format_help()
    assert from_args(parser.parse_args(["--truth", "t"]), Service) == Service(truth="t")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--coco", "c", "--truth", "t"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: argument --truth: not allowed with argument --coco")
    assert line.endswith("(prog --help lists the options)")


def test_the_command_line_gives_the_settings_back() -> None:
    settings = Settings(steps=3, name="a b", fast=True)
    words = to_command_line(settings, leave_out=("section",))
    assert words == ["--steps", "3", "--name", "a b", "--fast"]
    assert from_args(parser_for().parse_args(words), Settings) == settings
