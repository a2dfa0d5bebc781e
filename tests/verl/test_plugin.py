"""Plugin discovery in a fresh process, and `entropyrl doctor`.

verl 0.9.1 reads VERL_USE_EXTERNAL_PLUGINS once, in `verl/__init__.py`: "auto" (default) loads
every `verl.plugins` entry point, "none" loads none, anything else is a comma list of names.
"""

from __future__ import annotations

import os

import pytest

from entropyrl.commands import doctor

OURS = {
    "advantage_estimators": {"egpo", "egpo_ratio", "entropy_adv", "maxent_grpo"},
    "policy_losses": {"per_sample_clip"},
    "trainers": {"entropyrl"},
}
# registered only in a process that selects the CPU platform (VERL_PLATFORM=cpu)
CPU_WING = {"rollouts": {"hf"}, "platforms": {"cpu"}}
# what a GPU run's processes must not import: the CPU wing, the smoke's recorder and the rest of
# the test rig, the commands, the local runner
RIG = (
    "entropyrl.rig",
    "entropyrl.commands",
    "entropyrl.data",
    "entropyrl.evaluation",
)


def probe(policy: str | None, platform: str | None = None) -> dict:
    env = dict(os.environ)
    for name in ("VERL_USE_EXTERNAL_PLUGINS", "VERL_PLATFORM", "ENTROPYRL_TRACE_DIR"):
        env.pop(name, None)
    if policy is not None:
        env["VERL_USE_EXTERNAL_PLUGINS"] = policy
    if platform is not None:
        env["VERL_PLATFORM"] = platform
    return doctor.fresh_process_report(env=env)


@pytest.fixture(scope="module")
def auto_report() -> dict:
    return probe(None)


@pytest.fixture(scope="module")
def cpu_report() -> dict:
    return probe(None, "cpu")


def in_rig(module: str) -> bool:
    return any(module == rig or module.startswith(rig + ".") for rig in RIG)


def test_a_gpu_process_imports_the_product_only(auto_report, cpu_report):
    """`import verl` without the CPU selection loads the estimators, the loss, the trainer, the
    reward entry points and the config checks, nothing of the rig; a CPU run loads the wing."""
    assert [m for m in auto_report["entropyrl_modules"] if in_rig(m)] == []
    assert "entropyrl.verl.trainer" in auto_report["entropyrl_modules"]
    assert {"entropyrl.rig.cpu.platform", "entropyrl.rig.cpu.backend"} <= set(
        cpu_report["entropyrl_modules"]
    )
    for kind, names in CPU_WING.items():
        assert not names & set(auto_report[kind]), kind
        assert names <= set(cpu_report[kind]), kind
        assert all(cpu_report["ours"][kind].values())


@pytest.fixture(scope="module")
def none_report() -> dict:
    return probe("none")


def test_import_verl_registers_everything(auto_report):
    assert auto_report["verl_version"] == "0.9.1"
    assert auto_report["plugin_imported"]
    for kind, names in OURS.items():
        assert names <= set(auto_report[kind]), kind


def test_none_disables_discovery(none_report):
    assert not none_report["plugin_imported"]
    for kind, names in OURS.items():
        assert not names & set(none_report[kind]), kind
    # verl's own registrations are still there.
    assert "vanilla" in none_report["policy_losses"]


def test_entry_point_is_declared():
    assert doctor.entry_point_declared()


def test_doctor_reports_and_exits_zero(monkeypatch, capsys, auto_report):
    from entropyrl.cli import main

    monkeypatch.setattr(doctor, "fresh_process_report", lambda timeout=300.0: auto_report)
    assert main(["doctor", "--json"]) == 0
    out = capsys.readouterr().out
    assert "verl: 0.9.1" in out
    assert "per_sample_clip" in out and "maxent_grpo" in out
    assert "plugin loaded, all registered" in out


def test_doctor_fails_when_discovery_is_off(monkeypatch, capsys, none_report):
    from entropyrl.cli import main

    monkeypatch.setattr(doctor, "fresh_process_report", lambda timeout=300.0: none_report)
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "plugin NOT loaded" in out
    assert "VERL_USE_EXTERNAL_PLUGINS" in out


def test_doctor_module_imports_light():
    """`entropyrl --help` imports doctor.py: it must not pull verl or torch at import time."""
    import subprocess
    import sys

    code = (
        "import sys, entropyrl.commands.doctor; "
        "print(any(m == 'verl' or m.startswith(('verl.', 'torch')) for m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("policy", "loads"),
    [
        ("auto", True),
        (" AUTO ", True),
        ("none", False),
        ("other", False),
        ("other,entropyrl", True),
    ],
)
def test_the_plugin_policy_is_read_as_verl_reads_it(policy, loads):
    # verl/__init__.py: "auto" loads every entry point, "none" none, else the listed names
    problem = doctor.plugin_policy_problem({"VERL_USE_EXTERNAL_PLUGINS": policy})
    assert (problem is None) == loads
    if not loads:
        assert "keeps verl from loading the entropyrl plugin" in problem


def test_the_quick_check_before_a_launch_imports_no_verl(monkeypatch):
    """What the launch scripts ask before every run: the entry point and the policy, without the
    ~10 CPU-seconds of a fresh `import verl` (asked when a run fails)."""

    def no_import(timeout=300.0):
        raise AssertionError("the quick check started a fresh import of verl")

    monkeypatch.setattr(doctor, "fresh_process_report", no_import)
    monkeypatch.delenv("VERL_USE_EXTERNAL_PLUGINS", raising=False)
    assert doctor.discovery_problem(fresh_import=False) is None
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    assert "VERL_USE_EXTERNAL_PLUGINS=none" in doctor.discovery_problem(fresh_import=False)
    monkeypatch.setattr(doctor, "entry_point_declared", lambda: False)
    assert "is not declared" in doctor.discovery_problem(fresh_import=False)


def test_an_old_egg_info_on_the_path_does_not_hide_the_extensions(tmp_path, monkeypatch):
    """A checkout's root can hold an `entropyrl.egg-info` from an older install; first on the
    path, it shadows the installed metadata for `entry_points()`, so the extensions are looked
    up in every copy."""
    import importlib.metadata
    import sys

    from entropyrl.verl import extensions

    old = tmp_path / "entropyrl.egg-info"
    old.mkdir()
    (old / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: entropyrl\nVersion: 0.1.0\n")
    (old / "entry_points.txt").write_text("[verl.plugins]\nentropyrl = entropyrl.verl.plugin\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    shadowed = importlib.metadata.entry_points(group=extensions.GROUP, name=extensions.TRACE)
    assert list(shadowed) == []  # what a lookup of the first copy alone would find
    assert extensions.load(extensions.TRACE).__name__ == "entropyrl.rig.trace"
    with pytest.raises(RuntimeError, match="is not installed"):
        extensions.load("no-such-extension")
