"""In CI a missing dependency fails the run; elsewhere it skips (tests/conftest.py's policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def policy_source() -> str:
    text = (Path(__file__).parent / "conftest.py").read_text()
    start = text.index("# --- CI skip policy")
    return (
        "import os\n\nimport pytest\n\n"
        + text[start : text.index("# --- end of the CI skip policy")]
    )


TESTS = """
import pytest

def test_missing_module():
    pytest.importorskip("no_such_module_for_entropyrl")

def test_machine_cannot():
    pytest.skip("PID namespaces are not available here")
"""


MODULE_SKIP = """
import pytest

pytest.importorskip("no_such_module_for_entropyrl")

def test_never_collected():
    pass
"""


@pytest.mark.parametrize(("ci", "failed", "skipped"), [("true", 1, 1), ("", 0, 2)])
def test_a_missing_dependency_fails_only_in_ci(pytester, monkeypatch, ci, failed, skipped):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(TESTS)
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=failed, skipped=skipped)


def test_a_folder_skipped_at_import_fails_only_in_ci(pytester, monkeypatch):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(test_folder=MODULE_SKIP)
    monkeypatch.setenv("CI", "true")
    failed = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert failed.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the run
    failed.stdout.fnmatch_lines(["*CI=true: a dependency of these tests is missing*"])
    monkeypatch.setenv("CI", "")
    skipped = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    skipped.stdout.fnmatch_lines(["*1 skipped*"])
