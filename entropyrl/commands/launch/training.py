"""A verl recipe's launch, in order: `--smoke`'s plan, the GPUs, the recipe's preflight, the
smoke's assets, the input files and the model, the plugin, the CHAIR service, the training
command (printed by `--dry-run`, with the resources it would take), and the smoke's check."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from chair_server.launch import die_with_parent
from entropyrl.commands.launch import run_lock
from entropyrl.commands.launch.args import (
    REWARD_KWARGS,
    Launch,
    config_folder,
    config_name,
    override_key,
    override_value,
    say,
    split_command,
)
from entropyrl.commands.launch.checks import (
    Gpus,
    note_no_gpu,
    plugin_problem,
    preflight,
    require_file,
    require_gpu,
    require_model,
    require_verl,
)
from entropyrl.commands.launch.recipes import experiment_overrides, lora_overrides, recipe_for
from entropyrl.commands.launch.service import ChairService, chair_source, start_chair


def report_resources(launch: Launch, gpus: Gpus, values: dict[str, str]) -> None:
    """Dry run: the resources the training command would take (nodes x GPUs per node, from the
    composed config) and where the GPUs per node come from, on stderr."""
    if not launch.dry_run:
        return
    if launch.smoke:
        say(
            f"# dry-run: resources: {launch.ranks} rank(s) on the local CPU (smoke run: no GPU needed)"
        )
        return
    nodes, per_node = values.get("ER_NNODES", "?"), values.get("ER_GPUS_PER_NODE", "?")
    asked = override_value("trainer.n_gpus_per_node", launch.overrides)
    source = f"trainer.n_gpus_per_node={asked}" if asked else gpus.per_node_from
    total = str(int(nodes) * int(per_node)) if nodes.isdigit() and per_node.isdigit() else "?"
    say(
        f"# dry-run: resources: {nodes} node(s) x {per_node} GPU(s) per node = {total} GPU(s) "
        f"(GPUs per node: {source})"
    )
    if gpus.here < 1:
        note_no_gpu(gpus, "the training command", launch.quickstart)
    elif per_node.isdigit() and int(per_node) > gpus.here:
        say(
            f"# dry-run: the local host shows {gpus.here} GPU(s), fewer than the {per_node} "
            "per node asked for"
        )


def smoke_plan(launch: Launch, task: str, config: str) -> list[str]:
    """--smoke, before anything else: the run's folder, its environment (set here, inherited by
    the trainer) and overrides, the asset folder named but not built yet."""
    from entropyrl.commands import smoke
    from entropyrl.rig.smoke import run as smoke_run
    from entropyrl.rig.smoke import settings as smoke_settings

    launch.out = str(Path(launch.out or f"runs/{config}_smoke").resolve())
    Path(launch.out).mkdir(parents=True, exist_ok=True)
    require_verl(launch)
    try:
        settings = smoke_settings.default_settings(
            task, ranks=launch.ranks, model=os.environ.get("SMOKE_MODEL", "")
        )
        out = Path(launch.out)
        env, overrides = smoke_run.write_run_files(
            settings, smoke._cache_dir(out) / settings.asset_key(), out
        )
    except Exception as error:
        say(f"smoke: {error}")
        launch.fail("could not plan the smoke run (see the message above)")
        return []
    os.environ.update(env)
    return overrides


def smoke_build(launch: Launch, task: str) -> None:
    """--smoke, once the config passed its checks: build (or reuse) the tiny model and data, in
    a process of its own (torch stays out of this one)."""
    if launch.dry_run:
        return
    say(f"smoke: preparing the tiny model and data in {launch.out} (reused when present)")
    build = [launch.python, "-m", "entropyrl.commands.smoke", "build", task, "--out", launch.out]
    if subprocess.run([*build, "--ranks", str(launch.ranks)]).returncode != 0:
        launch.fail("could not prepare the smoke run (see the message above)")


def train(launch: Launch, command: list[str]) -> int:
    """Run the training command: as it is on GPUs; in a smoke with verl's output in the run's
    log and a line per step on the terminal. A dry run prints it. After a failed run (not one
    stopped by a signal) says in one line when verl did not load the plugin."""
    if launch.dry_run:
        print(shlex.join(command), flush=True)
        return 0
    if launch.smoke:
        from entropyrl.rig.smoke.run import run_trainer

        status = run_trainer(command, Path(launch.out))
    else:
        process = subprocess.Popen(command, preexec_fn=die_with_parent())
        try:
            status = process.wait()
        finally:
            if process.poll() is None:  # the launcher was stopped: so is its trainer
                process.terminate()
                process.wait()
    if status < 0:  # killed by a signal: the shell's 128 + signal
        status = 128 - status
    if status != 0 and status < 128:  # a run stopped by a signal says nothing about the plugin
        problem = plugin_problem(launch.python)
        if problem:
            say(f"error: {problem}")
    return status


def run(launch: Launch) -> int:
    """The launch, in order (the module's docstring)."""
    config = config_name(launch.command)
    trainer, own = split_command(launch.command)
    recipe = recipe_for(config_folder(launch.command), config, [*own, *launch.overrides])
    smoke_overrides: list[str] = []
    gpus = Gpus()
    if launch.smoke:
        smoke_overrides = smoke_plan(launch, recipe.task, config)
        # the smoke's data, model and GPUs per node replace the command's own
        smoke_keys = {override_key(o) for o in smoke_overrides}
        own = [o for o in own if override_key(o) not in smoke_keys]
    else:
        gpus = require_gpu(launch.fail)
        if gpus.per_node:
            own.append(f"trainer.n_gpus_per_node={gpus.per_node}")
    own += lora_overrides(recipe.lora, launch.fail)
    if recipe.chair:
        own += experiment_overrides()
    values = preflight(launch, config, [*smoke_overrides, *own, *launch.overrides])
    lock = None if launch.dry_run else take_run_folder(launch, values)
    try:
        if launch.smoke:
            smoke_build(launch, recipe.task)
        final = [*smoke_overrides, *own, *launch.overrides]
        for key, what in recipe.inputs.items():
            path = override_value(key, final)
            require_file(launch, path, what.format(folder=Path(path).parent))
        source = chair_source(launch, final) if recipe.chair else []
        require_model(launch, override_value("actor_rollout_ref.model.path", final))
        if not launch.dry_run:
            problem = plugin_problem(launch.python, "--quick")
            if problem:
                launch.fail(problem)
        extra: list[str] = []
        service: ChairService | None = None
        workdir = Path(tempfile.mkdtemp(prefix=f"{config}."))
        try:
            if recipe.chair:
                url, service = start_chair(launch, source, values, workdir)
                extra.append(f"{REWARD_KWARGS}.chair_url={url}")
            command = [*trainer, *smoke_overrides, *own, *extra, *launch.overrides]
            report_resources(launch, gpus, values)
            status = train(launch, command)
        finally:
            if service is not None:
                service.stop()
            shutil.rmtree(workdir, ignore_errors=True)
        if status == 0 and launch.smoke and not launch.dry_run:
            from entropyrl.commands import smoke

            status = smoke.main(
                ["check", recipe.task, "--out", launch.out, "--ranks", str(launch.ranks)]
            )
    finally:
        if lock is not None:
            lock.release()
    return status


def take_run_folder(launch: Launch, values: dict[str, str]) -> run_lock.RunLock | None:
    """The run's checkpoint folder, locked for this launch; a folder another launch holds
    stops this one (exit 2) with a line naming it."""
    folder = values.get("ER_CHECKPOINT_DIR")
    if not folder:
        return None
    lock = run_lock.take(Path(folder), launch.command)
    if isinstance(lock, str):
        launch.fail(lock)
    return lock
