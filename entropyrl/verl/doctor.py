"""`entropyrl doctor`: is the verl plugin installed, discovered and registered?

verl swallows plugin import errors (DEBUG log only), so a broken install would otherwise show up
as "Unknown advantage estimator" deep inside a Ray worker. This command imports nothing heavy
at module level (verl is imported inside the command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

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


def entry_point_declared() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.name == ENTRY_POINT_NAME and ep.value == PLUGIN_MODULE
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    )


def run(args: argparse.Namespace) -> int:
    ok = True
    try:
        import verl
    except ImportError as error:
        print(f"verl: not importable ({error}); install with `pip install 'entropyrl[verl]'`")
        return 1
    print(f"verl: {verl.__version__}")
    if verl.__version__ != SUPPORTED_VERL:
        print(
            f"  MISMATCH: entropyrl's plugin is written for verl {SUPPORTED_VERL} (its CPU "
            f"backend and rollout use verl internals); install verl[verl-core]=={SUPPORTED_VERL}"
        )
        ok = False
    from entropyrl.verl.cpu_backend import missing_names

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

    try:
        from entropyrl.verl import plugin

        registered = plugin.registrations()
    except Exception as error:  # report, do not hide, whatever broke the import
        print(f"plugin import: FAILED: {type(error).__name__}: {error}")
        return 1
    print("registered in this process:")
    for kind, names in registered.items():
        for name, present in names.items():
            print(f"  {kind:22s} {name:16s} {'ok' if present else 'MISSING'}")
            ok &= present

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
    parser.set_defaults(func=run)
