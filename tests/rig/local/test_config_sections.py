"""The local runner's spec sections are the core's: `SPEC_FIELDS` is read from `DemoConfig`'s
fields, and every algorithm section of `entropyrl.core.specs` is one of them unless it is named
verl-only, so a new section cannot be forgotten by one engine."""

from __future__ import annotations

import dataclasses

from entropyrl.core.specs import SPEC_CLASSES, AlgorithmSpecs, PpoClipSpec
from entropyrl.rig.local.config import SPEC_FIELDS, VERL_ONLY_SECTIONS, DemoConfig


def test_every_algorithm_section_runs_locally_or_is_named_verl_only():
    sections = {spec.SECTION: spec for spec in SPEC_CLASSES}
    local = {name: spec for name, spec in SPEC_FIELDS.items() if name != "ppo"}
    assert set(VERL_ONLY_SECTIONS) <= set(sections)
    assert set(local) == set(sections) - set(VERL_ONLY_SECTIONS)
    assert all(sections[name] is spec for name, spec in local.items())
    assert SPEC_FIELDS["ppo"] is PpoClipSpec


def test_the_sections_are_read_from_the_config_fields():
    names = [item.name for item in dataclasses.fields(DemoConfig)]
    assert list(SPEC_FIELDS) == [name for name in names if name in SPEC_FIELDS]
    config = DemoConfig()
    for name, spec in SPEC_FIELDS.items():
        assert isinstance(getattr(config, name), spec)


def test_the_core_sections_are_the_fields_of_algorithm_specs():
    fields = dataclasses.fields(AlgorithmSpecs)
    assert [spec.SECTION for spec in SPEC_CLASSES] == [item.name for item in fields]
