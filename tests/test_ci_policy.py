"""In CI every skip fails unless its test id is listed as allowed; elsewhere a skip stays a skip
(tests/conftest.py's policy, run here on its own in pytester's sandbox)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]


MACHINE_CANNOT = "PID namespaces are not available here"  # test_machine_cannot's reason


def policy_source(*allowed: str, reason: str = MACHINE_CANNOT) -> str:
    """The policy block of tests/conftest.py, with `allowed` test ids added to its list, each
    allowed to skip for `reason`."""
    text = (Path(__file__).parent / "conftest.py").read_text()
    start = text.index("# --- CI skip policy")
    block = text[start : text.index("# --- end of the CI skip policy")]
    extra = "".join(f"ALLOWED_SKIPS[{nodeid!r}] = {reason!r}\n" for nodeid in allowed)
    return "import os\nfrom typing import Any\n\nimport pytest\n\n" + block + "\n" + extra


TESTS = """
import pytest

def test_missing_module():
    pytest.importorskip("no_such_module_for_entropyrl")

def test_broken_module():
    # what a skip for a half-installed package says: no phrase about a missing module
    pytest.skip("cannot import name 'ast_checker' from 'bfcl_eval.eval_checker'")

def test_machine_cannot():
    pytest.skip("PID namespaces are not available here")

@pytest.fixture
def needs_something():
    pytest.skip("the fixture's resource is not here")

def test_fixture_skip(needs_something):
    pass

@pytest.mark.skipif(True, reason="a condition")
def test_marked():
    pass
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, *args: str):
    monkeypatch.setenv("CI", ci)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def test_every_skip_fails_in_ci_whatever_it_says(pytester, monkeypatch):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(test_skips=TESTS)
    result = run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=3, errors=2)  # a skip in a fixture fails the setup
    result.stdout.fnmatch_lines(
        [
            "*test_missing_module*was skipped*no_such_module_for_entropyrl*",
            "*test_broken_module*was skipped*cannot import name 'ast_checker'*",
        ]
    )


def test_outside_ci_a_skip_stays_a_skip(pytester, monkeypatch):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(test_skips=TESTS)
    run(pytester, monkeypatch, "").assert_outcomes(skipped=5)


def test_an_allowed_id_stays_a_skip_and_is_listed_at_the_end(pytester, monkeypatch):
    pytester.makeconftest(policy_source("test_skips.py::test_machine_cannot"))
    pytester.makepyfile(test_skips=TESTS)
    result = run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=2, errors=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*skips CI allows*",
            "test_skips.py::test_machine_cannot: *PID namespaces are not available here*",
        ]
    )


def test_an_allowed_id_skipped_for_another_reason_fails(pytester, monkeypatch):
    """Allowed for what the machine cannot do; skipped because a module went missing: red."""
    pytester.makeconftest(policy_source("test_skips.py::test_missing_module"))
    pytester.makepyfile(test_skips=TESTS)
    result = run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_missing_module was skipped (*no_such_module_for_entropyrl*), not for the "
            f"reason ALLOWED_SKIPS*allows it ({MACHINE_CANNOT})*"
        ]
    )
    result.stdout.fnmatch_lines(["*skips CI allows*", "none happened"])


XFAIL = """
import pytest

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False

def test_fine():
    pass
"""


def test_an_expected_failure_fails_in_ci_and_stays_one_elsewhere(pytester, monkeypatch):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(test_xfail=XFAIL)
    result = run(pytester, monkeypatch, "true")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*test_known_bug failed as expected (xfail: a known bug)*"])
    run(pytester, monkeypatch, "").assert_outcomes(xfailed=1, passed=1)


def test_an_unexpected_pass_fails_everywhere():
    """`xfail_strict`: a test marked xfail that passes is a failure, CI or not."""
    text = (REPO / "pyproject.toml").read_text()
    section = text[text.index("[tool.pytest.ini_options]") :].split("\n[", 1)[0]
    assert "xfail_strict = true" in section.splitlines()


def test_the_policy_holds_in_ci_s_two_worker_mode(pytester, monkeypatch):
    """tools/test.sh runs the suite in two pytest-xdist workers: the workers convert the
    skips, the controller lists the allowed ones and keeps the run red."""
    pytester.makeconftest(policy_source("test_skips.py::test_machine_cannot"))
    pytester.makepyfile(test_skips=TESTS)
    result = run(pytester, monkeypatch, "true", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(failed=2, errors=2, skipped=1)
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*skips CI allows*", f"test_skips.py::test_machine_cannot: *{MACHINE_CANNOT}*"]
    )


MODULE_SKIP = """
import pytest

pytest.importorskip("no_such_module_for_entropyrl")

def test_never_collected():
    pass
"""


def test_a_module_skipped_at_import_fails_only_in_ci(pytester, monkeypatch):
    pytester.makeconftest(policy_source())
    pytester.makepyfile(test_folder=MODULE_SKIP)
    failed = run(pytester, monkeypatch, "true")
    assert failed.ret != pytest.ExitCode.OK
    failed.stdout.fnmatch_lines(["*CI=true: *was skipped*no_such_module_for_entropyrl*"])
    run(pytester, monkeypatch, "").stdout.fnmatch_lines(["*1 skipped*"])


def test_a_folder_whose_conftest_skips_fails_only_in_ci(pytester, monkeypatch):
    """What a sub-folder's conftest once did (tests/verl's): importorskip there skipped every
    test under it as one SKIPPED line."""
    pytester.makeconftest(policy_source())
    folder = pytester.mkpydir("engine_tests")
    (folder / "conftest.py").write_text(
        'import pytest\n\npytest.importorskip("no_such_engine_for_entropyrl")\n'
    )
    (folder / "test_engine.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    pytester.makepyfile(test_elsewhere="def test_c():\n    pass\n")
    failed = run(pytester, monkeypatch, "true")
    assert failed.ret != pytest.ExitCode.OK
    failed.stdout.fnmatch_lines(["*CI=true: *was skipped*no_such_engine_for_entropyrl*"])
    assert "skipped" not in failed.stdout.lines[-1]
    skipped = run(pytester, monkeypatch, "")
    assert skipped.ret == pytest.ExitCode.OK
    skipped.stdout.fnmatch_lines(["*1 passed, 1 skipped*"])


def test_ci_sets_the_variable_itself():
    """`.ci/run` exports CI=true before the README's test command, so the policy holds on a
    runner that does not set it."""
    script = (REPO / ".ci" / "run").read_text()
    exports = [line.strip() for line in script.splitlines() if line.strip().startswith("export")]
    assert "export CI=true" in exports
    assert script.index("export CI=true") < script.index("tools/test.sh")


def allowed_skips() -> dict[str, str]:
    """ALLOWED_SKIPS as tests/conftest.py writes it (read, not imported: importing the suite's
    conftest again would make another set of cache folders)."""
    import ast

    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "ALLOWED_SKIPS":
            return ast.literal_eval(node.value)
    raise AssertionError("tests/conftest.py has no ALLOWED_SKIPS")


def test_each_allowed_id_names_a_test_of_the_suite():
    allowed = allowed_skips()
    assert allowed
    for nodeid, why in allowed.items():
        path, _, name = nodeid.partition("::")
        source = (REPO / path).read_text()
        assert f"def {name.split('[')[0]}(" in source, nodeid
        assert why and why in source, f"{nodeid}: no skip in {path} gives the reason {why!r}"


def test_every_test_that_calls_ray_init_is_marked_ray():
    """`pytest -m "not ray"` (the fast subset) starts no Ray: a test that starts Ray itself
    carries the marker (those that take a smoke fixture are marked by tests/conftest.py)."""
    import ast

    unmarked = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = "pytest.mark.ray" in ast.unparse(
            [n for n in tree.body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)] or ast.Pass()
        )  # fmt: skip
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            marked = module_marked or any(
                "pytest.mark.ray" in ast.unparse(d) for d in node.decorator_list
            )
            if "ray" + ".init(" in ast.unparse(node) and not marked:
                unmarked.append(f"{path.relative_to(REPO)}::{node.name}")
    assert unmarked == [], "tests that start Ray without the ray marker: " + ", ".join(unmarked)
