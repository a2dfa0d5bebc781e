"""`entropyrl doctor`: is the verl plugin installed, discovered and registered?

`entropyrl doctor --recipe NAME|PATH [OVERRIDES]` checks instead what one training run needs on
this node: the recipe composed with the overrides as verl composes it, its algorithm settings
and batch geometry, verl / vLLM / torch / transformers against verl 0.9.1's pins, flash-attn
when the recipe's attention needs it, the GPUs this process sees against the layout, data and
model, and a shared checkpoint folder on more than one node (`entropyrl.commands.preflight`). Each
problem is one line with its fix; it exits 0 only when the run could start.

verl swallows plugin import errors (DEBUG log only), so a broken install would otherwise show up
as "Unknown advantage estimator" deep inside a Ray worker. This command imports nothing heavy
at module level (verl is imported inside the command).

It says what it checks before each slow step (importing verl pulls in torch, transformers and
Ray; the last check does it again in a fresh interpreter). The messages verl prints on every
import that are expected on a working setup are collected and explained in one line instead
(`--verbose` prints them as they come): verl warns when it finds no GPU, and once per optional
training engine that is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping

ENTRY_POINT_GROUP = "verl.plugins"
ENTRY_POINT_NAME = "entropyrl"
PLUGIN_MODULE = "entropyrl.verl.plugin"

SUPPORTED_VERL = "0.9.1"

# Run in a fresh interpreter: only `import verl`, then read verl's registries. Our plugin is
# never imported explicitly, so this sees exactly what verl's discovery did.
_FRESH_PROCESS_PROBE = f"""
import json, sys
import verl
from verl.plugin.platform import PlatformRegistry
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import trainer_base
from verl.workers.rollout.replica import RolloutReplicaRegistry
print(json.dumps({{
    "verl_version": verl.__version__,
    "plugin_imported": {PLUGIN_MODULE!r} in sys.modules,
    "advantage_estimators": sorted(core_algos.ADV_ESTIMATOR_REGISTRY),
    "policy_losses": sorted(core_algos.POLICY_LOSS_REGISTRY),
    "trainers": sorted(trainer_base.TRAINER_REGISTRY),
    "rollouts": sorted(RolloutReplicaRegistry._registry),
    "platforms": sorted(PlatformRegistry.registered_names()),
    "ours": (
        sys.modules[{PLUGIN_MODULE!r}].registrations() if {PLUGIN_MODULE!r} in sys.modules else None
    ),
    "entropyrl_modules": sorted(m for m in sys.modules if m.split(".")[0] == "entropyrl"),
}}))
"""


def fresh_process_report(timeout: float = 300.0, env: dict[str, str] | None = None) -> dict:
    """What a fresh `import verl` registers, as a dict (raises RuntimeError if the probe fails)."""
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS_PROBE],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ if env is None else env),
    )
    if result.returncode != 0:
        raise RuntimeError(f"`import verl` failed in a fresh process:\n{result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# verl 0.9.1, verl/workers/engine/__init__.py: one UserWarning per optional engine not installed
_ENGINE_WARNING = re.compile(r"^(\w+) engine is not available")
# verl 0.9.1, verl/plugin/platform/platform_manager.py: no CUDA/NPU/ROCm device answered
_NO_ACCELERATOR = ("No supported accelerator detected", "is registered but not available")
# verl 0.9.1, verl/trainer/ppo/utils.py:need_critic: GRPO-style estimators need no critic
_CRITIC_DISABLED = "Disabled critic as algorithm.adv_estimator != gae"


def unexpected(lines: list[str]) -> list[str]:
    """The collected verl messages that a working setup does not print."""
    return [
        line
        for line in lines
        if not _ENGINE_WARNING.search(_text(line))
        and not any(marker in line for marker in _NO_ACCELERATOR)
        and _CRITIC_DISABLED not in line
    ]


class _Collected(logging.Handler):
    """Holds log records instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def expected_verl_messages(verbose: bool) -> Iterator[list[str]]:
    """Collect what verl logs and warns while imported; yields the list of lines it printed
    nothing for (empty with ``verbose``). Call ``explain`` on it afterwards."""
    lines: list[str] = []
    if verbose:
        yield lines
        return
    root = logging.getLogger()
    handler = _Collected()
    # With a handler on the root logger, verl's own logging.basicConfig (run at import) adds
    # none, so its WARNING lines reach only this handler.
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:  # the filters in force apply
            yield lines
    finally:
        root.removeHandler(handler)
    for record in handler.records:
        if record.levelno >= logging.WARNING:
            lines.append(f"{record.name}: {record.getMessage()}")
    for warning in caught:
        lines.append(f"{warning.category.__name__}: {warning.message}")


def explain(lines: list[str]) -> list[str]:
    """One line for the expected messages, the unexpected ones as they were."""
    engines = sorted({m.group(1) for line in lines if (m := _ENGINE_WARNING.search(_text(line)))})
    no_gpu = any(marker in line for line in lines for marker in _NO_ACCELERATOR)
    critic = any(_CRITIC_DISABLED in line for line in lines)
    other = unexpected(lines)
    out = []
    expected = len(lines) - len(other)
    if expected:
        reasons = []
        if no_gpu:
            reasons.append(
                "no GPU visible, so verl falls back to its CUDA platform (expected without a "
                "GPU; CPU runs set VERL_PLATFORM=cpu)"
            )
        if engines:
            reasons.append(
                f"optional verl training engines not installed: {', '.join(engines)} "
                "(entropyrl uses verl's FSDP engine)"
            )
        if critic:
            reasons.append("no critic for a group-relative estimator")
        out.append(
            f"  {expected} expected verl messages not shown (--verbose shows them): "
            + "; ".join(reasons)
        )
    out += [f"  verl: {line}" for line in other]
    return out


def _text(line: str) -> str:
    return line.split(": ", 1)[1] if ": " in line else line


def entry_point_declared() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.name == ENTRY_POINT_NAME and ep.value == PLUGIN_MODULE
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    )


def _step(text: str) -> None:
    print(f"{text} ...", flush=True)


def run_recipe(args: argparse.Namespace) -> int:
    """`--recipe`: every check a training run of that recipe needs here, one line each."""
    from entropyrl.commands import preflight
    from entropyrl.verl.checks import layout

    print(f"entropyrl doctor: can `{args.recipe}` train on this node?", flush=True)
    if not preflight.verl_installed():
        print(f"PROBLEM stack: {preflight.NO_VERL}")
        print("1 problem(s): this run cannot start here as configured")
        return 1
    try:
        config = preflight.compose_recipe(args.recipe, args.overrides)
        findings = preflight.config_findings(config)
    except Exception as error:  # a bad override or recipe name: one line
        print(f"PROBLEM config: {' '.join(str(error).split())}")
        return 1
    if not findings:
        findings.append(preflight.Finding("config", True, "algorithm settings and batch geometry"))
    findings += preflight.stack_findings(config)
    findings += preflight.gpu_findings(config)
    findings += layout.input_findings(config)
    findings += layout.fits_findings(config)  # the dry run's "fits" line
    findings += [f for f in preflight.prompt_findings(config) if f.ok]  # refusals: config
    findings += preflight.node_findings(config)
    for finding in findings:
        label = "ok     " if finding.ok else "PROBLEM" if finding.blocking else "warning"
        print(f"{label} {finding.check}: {finding.line}")
    # a version off verl's pins is a warning here as in the launch scripts and docs/install.md
    problems = sum(not f.ok and f.blocking for f in findings)
    warnings_ = sum(not f.ok and not f.blocking for f in findings)
    also = f" ({warnings_} warning(s) above)" if warnings_ else ""
    print(
        f"{problems} problem(s): this run cannot start here as configured{also}"
        if problems
        else f"this run can start here{also}"
    )
    return 1 if problems else 0


def plugin_policy_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Whether `VERL_USE_EXTERNAL_PLUGINS` (of `environ`, default this process's environment)
    lets verl load ours (verl/__init__.py: "auto" all, "none" none, else a comma-separated list
    of entry-point names)."""
    environ = os.environ if environ is None else environ
    policy = environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if policy == "auto":
        return None
    names = {name.strip() for name in policy.split(",") if name.strip()}
    if policy != "none" and ENTRY_POINT_NAME in names:
        return None
    return (
        f"VERL_USE_EXTERNAL_PLUGINS={policy} keeps verl from loading the entropyrl plugin "
        f"(unset it, or add {ENTRY_POINT_NAME} to the list)"
    )


def discovery_problem(timeout: float = 300.0, *, fresh_import: bool = True) -> str | None:
    """What keeps verl from loading the plugin in a fresh `import verl` (one line), or None.

    Without `fresh_import` only what can be read without importing verl (the entry point, verl's
    plugin policy): the launch scripts ask that before every run (an import of verl costs some
    10 CPU-seconds) and the full check when a run fails."""
    if not entry_point_declared():
        return (
            f"the entry point {ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} is not declared "
            "(reinstall entropyrl: pip install -e .)"
        )
    policy = plugin_policy_problem()
    if policy or not fresh_import:
        return policy
    try:
        report = fresh_process_report(timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        return f"a fresh `import verl` failed: {str(error).splitlines()[-1]}"
    if report["verl_version"] != SUPPORTED_VERL:
        return f"verl {report['verl_version']} is installed; the plugin is written for {SUPPORTED_VERL}"
    if not report["plugin_imported"]:
        policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto")
        return (
            f"verl did not load the plugin (VERL_USE_EXTERNAL_PLUGINS={policy}; run "
            "`entropyrl doctor` for why)"
        )
    missing = [
        f"{kind}:{name}"
        for kind, names in (report["ours"] or {}).items()
        for name, present in names.items()
        if not present
    ]
    return f"not registered with verl: {', '.join(missing)}" if missing else None


def gpu_route_lines() -> list[str]:
    """On a node with an NVIDIA driver: the install route its driver needs and whether the
    installed torch is on it (nothing without `nvidia-smi`, as on a CPU machine)."""
    from entropyrl.verl.checks import stack

    driver = stack.nvidia_driver()
    if driver is None:
        return []
    lines = [f"GPU install route for NVIDIA driver {driver}: {stack.gpu_install_for(driver)}"]
    version, cuda = stack.torch_build()
    sees = stack.torch_sees_gpu() if cuda is not None else None
    for finding in stack.driver_findings(driver, version, cuda, sees):
        verdict = "ok" if finding.ok else "would stop a GPU run"
        lines.append(f"GPU stack in use: {verdict}: {finding.line}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.recipe:
        return run_recipe(args)
    if args.discovery:
        problem = discovery_problem(timeout=args.timeout, fresh_import=not args.quick)
        fine = (
            "verl's entry points declare the entropyrl plugin and its policy loads it"
            if args.quick
            else "verl loads the entropyrl plugin and its registrations in a fresh process"
        )
        print(problem or fine)
        return 1 if problem else 0
    if args.overrides:
        print("error: overrides belong to --recipe (entropyrl doctor --recipe NAME OVERRIDES)")
        return 2
    ok = True
    print("entropyrl doctor: the verl plugin's install, registrations and discovery", flush=True)
    _step("importing verl (it loads torch, transformers and Ray: the slow part)")
    with expected_verl_messages(args.verbose) as messages:
        try:
            import verl
        except ImportError as error:
            print(f"verl: not importable ({error}); install with `pip install 'entropyrl[verl]'`")
            return 1
        from entropyrl.rig.cpu.backend import missing_names
    print(f"verl: {verl.__version__}")
    for line in explain(messages):
        print(line)
    if verl.__version__ != SUPPORTED_VERL:
        print(
            f"  MISMATCH: entropyrl's plugin is written for verl {SUPPORTED_VERL} (its CPU "
            f"backend and rollout use verl internals); install verl[verl-core]=={SUPPORTED_VERL}"
        )
        ok = False
    missing = missing_names()
    print(
        "verl internals used by the CPU backend and the hf rollout: "
        + ("present" if not missing else "MISSING " + ", ".join(missing))
    )
    ok &= not missing
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto")
    print(f"VERL_USE_EXTERNAL_PLUGINS: {policy}")
    declared = entry_point_declared()
    print(
        f"entry point {ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} -> {PLUGIN_MODULE}: "
        f"{'declared' if declared else 'MISSING (reinstall entropyrl)'}"
    )
    ok &= declared

    _step("importing the plugin")
    try:
        with expected_verl_messages(args.verbose) as messages:
            from entropyrl.verl import plugin

            registered = plugin.registrations()
    except Exception as error:  # report, do not hide, whatever broke the import
        print(f"plugin import: FAILED: {type(error).__name__}: {error}")
        return 1
    for line in explain(messages):
        print(line)
    print("registered in this process:")
    for kind, names in registered.items():
        for name, present in names.items():
            print(f"  {kind:22s} {name:16s} {'ok' if present else 'MISSING'}")
            ok &= present

    _step("checking discovery in a fresh Python that only runs `import verl` (slow again)")
    try:
        report = fresh_process_report(timeout=args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        print(f"fresh process: FAILED: {error}")
        return 1
    loaded = report["plugin_imported"] and all(
        name in report.get(kind, ()) for kind, names in registered.items() for name in names
    )
    print(
        "fresh process (`import verl` only): "
        + ("plugin loaded, all registered" if loaded else "plugin NOT loaded")
    )
    if not loaded and policy.strip().lower() != "auto":
        print("  hint: VERL_USE_EXTERNAL_PLUGINS must be 'auto' or list 'entropyrl'")
    ok &= loaded
    for line in gpu_route_lines():
        print(line)
    print(
        "before a GPU run: `entropyrl doctor --recipe chair_mscoco [overrides]` checks what that "
        "run needs on this node (vLLM, flash-attn, GPUs, batch geometry, data, model)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "verl_version": verl.__version__,
                    "registered": registered,
                    "fresh_process": report,
                    "ok": bool(ok),
                }
            )
        )
    return 0 if ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the verl plugin: verl version, registrations, fresh-process discovery",
        description=__doc__,
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds allowed for the fresh-process probe (default 300)",
    )
    parser.add_argument("--json", action="store_true", help="also print a JSON summary")
    parser.add_argument(
        "--discovery",
        action="store_true",
        help="only the last check: does a fresh `import verl` load the plugin and register "
        "everything (one line; what the launch scripts ask before a run)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="with --discovery: only what needs no import of verl (the entry point and "
        "VERL_USE_EXTERNAL_PLUGINS); the launch scripts ask this before a run, the full check "
        "when a run fails",
    )
    parser.add_argument(
        "--recipe",
        metavar="NAME|PATH",
        help="check what a training run of this recipe (configs/NAME.yaml or a config path) "
        "needs on this node instead; Hydra overrides may follow",
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides of the --recipe run (as the run gets them)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print verl's own warnings as they come, expected ones included",
    )
    parser.set_defaults(func=run)
