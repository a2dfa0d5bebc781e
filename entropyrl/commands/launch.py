"""`entropyrl launch`: what runs around a verl training command, for the launch scripts.

Each training script in examples/ is its training command, written out:

    exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \\
      "$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name chair_mscoco \\
        data.train_files="$DATA_DIR/train.parquet" ...

This command takes the script's flags and the user's Hydra overrides (before the last `--`) and
the training command (after it), and does, in order: `--smoke`'s plan (a tiny model and data
named, the CPU environment), the GPUs (nvidia-smi, CUDA_VISIBLE_DEVICES, N_GPUS), the recipe
composed with every override and checked (`entropyrl.commands.preflight`), the smoke's assets,
the input files and the model, the plugin's entry point, for captioning recipes the CHAIR
service (started on a free port, supervised, stopped on any exit), then the training command
with the recipe's extra overrides and the user's last (Hydra: the last one wins), and the
smoke's check. `--dry-run` prints the commands instead, shell-quoted, and turns missing
prerequisites into notes; what it would take (nodes x GPUs) goes to stderr.

A usage mistake or a missing prerequisite is one `error:` line and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

TRAINER_MODULE = "verl.trainer.main_ppo"
OPTIONS = "--dry-run, --smoke, --out DIR, --ranks N, --help"


@dataclass(frozen=True)
class Recipe:
    """What a recipe needs around its training command."""

    task: str  # the smoke's task (entropyrl.commands.smoke)
    lora: str  # "vision": LoRA leaves the vision tower alone; "text"
    # override key -> what the file is and how to make it ({folder}: the file's folder)
    inputs: dict[str, str] = field(default_factory=dict)
    chair: bool = False  # starts the CHAIR service and passes its URL to the reward


_FC_INPUTS = {
    "data.train_files": "run: entropyrl prepare fc --format xlam --input "
    "xlam_function_calling_60k.json --out {folder}",
    "data.val_files": "written by entropyrl prepare fc",
}
RECIPES: dict[str, Recipe] = {
    "chair_mscoco": Recipe(
        "caption",
        "vision",
        {
            "data.train_files": "run: entropyrl prepare coco --annotations ... --images ... "
            "--out {folder}",
            "data.val_files": "written by entropyrl prepare coco",
            "reward.custom_reward_function.reward_kwargs.cider_df": "CIDEr-D document "
            "frequencies, written by entropyrl prepare coco",
        },
        chair=True,
    ),
    "egpo_function_calling": Recipe("function-calling", "text", _FC_INPUTS),
    "grpo_function_calling": Recipe("function-calling", "text", _FC_INPUTS),
    "egpo_ratio_mixed": Recipe(
        "mixed",
        "text",
        {
            "data.train_files": "run: entropyrl prepare mixed-debug --out {folder}",
            "data.val_files": "written by entropyrl prepare mixed-debug",
        },
    ),
}

# EXPERIMENT: the captioning comparisons, each under its own trainer.experiment_name (so its
# checkpoints land in their own folder, where examples/eval_chair_mscoco.sh finds them).
#   entropyrl  the recipe: per-sample eps_high from CHAIR_i (clean 0.3 / hallucinating 0.5)
#   baseline   GRPO: no schedule, eps_high 0.3 for every sample
#   penalty    GRPO with reward CIDEr-D - 1.0 x (hallucinated mentions), no schedule: the
#              reward that lowered CHAIR in the study
#   reversed   the rule turned round: clean 0.5 / hallucinating 0.3
_KWARGS = "reward.custom_reward_function.reward_kwargs"
EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "entropyrl": (),
    "baseline": (
        "algorithm.clip_schedule.enable=false",
        "trainer.experiment_name=chair_mscoco_baseline",
    ),
    "penalty": (
        "algorithm.clip_schedule.enable=false",
        f"{_KWARGS}.chair_weight=1.0",
        f"{_KWARGS}.chair_penalty=count",
        "trainer.experiment_name=chair_mscoco_penalty",
    ),
    "reversed": (
        "algorithm.clip_schedule.direction=hallucinated_low",
        "trainer.experiment_name=chair_mscoco_reversed",
    ),
}


class Stop(Exception):
    """Stop the launch with this exit status (its lines were printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the command line ---------------------------------------------------------------------------


@dataclass
class Launch:
    """One launch: the script's flags, the user's overrides, the training command."""

    script: str
    command: list[str]
    overrides: list[str] = field(default_factory=list)
    dry_run: bool = False
    smoke: bool = False
    out: str = ""
    ranks: int = 1

    @property
    def python(self) -> str:
        return os.environ.get("PYTHON") or "python3"

    @property
    def quickstart(self) -> str:
        return (
            f"No GPU here? `bash {self.script} --smoke` runs this same verl trainer on the CPU "
            "with a tiny model; the CPU quick start (bash examples/quickstart.sh) runs the "
            "algorithms on one machine."
        )

    def fail(self, problem: str) -> None:
        """A prerequisite not met: a note in a dry run, else one error line and exit 2."""
        if self.dry_run:
            say(f"# dry-run: prerequisite not met: {problem}")
            return
        say(f"error: {problem}")
        if not self.smoke:
            say(self.quickstart)
        raise Stop(2)


def usage_error(message: str) -> NoReturn:
    say(f"error: {message}")
    raise Stop(2)


def script_help(script: str) -> str:
    """A script's header comment (its lines after the shebang up to `set -`), as its --help."""
    lines = []
    for line in Path(script).read_text().splitlines()[1:]:
        if line.startswith("set -"):
            break
        lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> Launch:
    """`SCRIPT [flags] [overrides] -- COMMAND...` -> a Launch (usage mistakes: exit 2)."""
    argv = list(argv)
    if not argv or "--" not in argv[1:]:
        usage_error("usage: entropyrl launch SCRIPT [options] [key=value ...] -- COMMAND ...")
    split = len(argv) - 1 - argv[::-1].index("--")
    launch = Launch(script=argv[0], command=argv[split + 1 :])
    launch.dry_run = os.environ.get("DRY_RUN", "0") == "1"
    args = iter(argv[1:split])
    ranks = "1"
    for arg in args:
        if arg == "--dry-run":
            launch.dry_run = True
        elif arg == "--smoke":
            launch.smoke = True
        elif arg in ("--out", "--ranks"):
            value = next(args, None)
            if value is None:
                usage_error("--out needs a folder" if arg == "--out" else "--ranks needs a number")
            if arg == "--out":
                launch.out = value
            else:
                ranks = value
        elif arg.startswith("--out="):
            launch.out = arg[len("--out=") :]
        elif arg.startswith("--ranks="):
            ranks = arg[len("--ranks=") :]
        elif arg in ("-h", "--help"):
            print(script_help(launch.script))
            raise Stop(0)
        elif arg.startswith("-"):
            # a misspelt flag would otherwise reach Hydra as an override, or be taken for one
            usage_error(
                f"unknown option {arg} (the options: {OPTIONS}; everything else is a Hydra "
                "override, key=value)"
            )
        else:
            launch.overrides.append(arg)
    if not ranks.isdigit() or int(ranks) == 0:
        usage_error(f"--ranks must be a positive integer, got '{ranks}'")
    launch.ranks = int(ranks)
    if not launch.smoke and (launch.out or launch.ranks != 1):
        usage_error("--out and --ranks belong to --smoke (a GPU run takes trainer.* overrides)")
    return launch


# -- the training command -----------------------------------------------------------------------


def config_name(command: Sequence[str]) -> str:
    """The `--config-name` of a `verl.trainer.main_ppo` command."""
    if TRAINER_MODULE not in command or "--config-name" not in command[:-1]:
        usage_error(f"the training command must be `python -m {TRAINER_MODULE} --config-name ...`")
    return command[command.index("--config-name") + 1]


def split_command(command: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the trainer and its options up to the config name, the command's own overrides)."""
    end = command.index("--config-name") + 2
    return list(command[:end]), list(command[end:])


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def override_value(key: str, overrides: Sequence[str]) -> str:
    """The value of the last KEY=VALUE (or +KEY=, ++KEY=) among `overrides`, as Hydra applies
    them (the last one wins); empty when none sets KEY."""
    value = ""
    for override in overrides:
        if "=" in override and override_key(override) == key:
            value = override.split("=", 1)[1]
    return value


def lora_overrides(kind: str, fail: Callable[[str], None]) -> list[str]:
    """LoRA instead of full fine-tuning when LORA_RANK > 0, through verl's own keys: adapters of
    rank LORA_RANK and scale LORA_ALPHA / LORA_RANK (alpha default 2 x rank) on every linear
    layer of the language model (a VLM's vision tower excluded, as in verl's VLM LoRA example:
    vLLM applies no LoRA there), and the learning rate LORA_LR (default 1e-5: 10x the recipes'
    full fine-tuning rate, docs/lora.md). The caller's overrides come later and win."""
    rank = os.environ.get("LORA_RANK", "0") or "0"
    if not rank.isdigit():
        fail(f"LORA_RANK must be a whole number (0: full fine-tuning), got '{rank}'")
        return []
    if int(rank) == 0:
        return []
    overrides = [
        f"actor_rollout_ref.model.lora_rank={rank}",
        f"actor_rollout_ref.model.lora_alpha={os.environ.get('LORA_ALPHA') or 2 * int(rank)}",
        "actor_rollout_ref.model.target_modules=all-linear",
        f"actor_rollout_ref.actor.optim.lr={os.environ.get('LORA_LR') or '1e-5'}",
    ]
    if kind == "vision":
        overrides.append("actor_rollout_ref.model.exclude_modules='.*visual.*'")
    return overrides


def experiment_overrides() -> list[str]:
    name = os.environ.get("EXPERIMENT") or "entropyrl"
    if name not in EXPERIMENTS:
        usage_error(f"EXPERIMENT must be entropyrl, baseline, penalty or reversed, got '{name}'")
    return list(EXPERIMENTS[name])


# -- GPUs ---------------------------------------------------------------------------------------


@dataclass
class Gpus:
    """The GPUs this process can use, and the GPUs per node the run asks for."""

    here: int = 0
    seen: str = "nvidia-smi not run"
    per_node: str = ""  # empty: the config's own
    per_node_from: str = "the config"
    smi: bool = False


def count_gpus() -> Gpus:
    """What nvidia-smi lists, cut to CUDA_VISIBLE_DEVICES when it is set (CUDA stops at the
    first empty or negative entry)."""
    gpus = Gpus()
    if shutil.which("nvidia-smi"):
        gpus.smi = True
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout
        gpus.here = sum(1 for line in listed.splitlines() if line)
        gpus.seen = f"nvidia-smi lists {gpus.here}"
    else:
        gpus.seen = "nvidia-smi not found"
    visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible_devices is not None:
        visible = 0
        for device in visible_devices.split(","):
            if device == "" or device.startswith("-"):
                break
            visible += 1
        gpus.here = min(gpus.here, visible)
        gpus.seen += f", CUDA_VISIBLE_DEVICES={visible_devices} leaves {gpus.here}"
    return gpus


def require_gpu(fail: Callable[[str], None]) -> Gpus:
    """At least one NVIDIA GPU visible; GPUs per node from N_GPUS, else those visible. A dry run
    on a machine without GPUs plans for the config's own GPUs per node."""
    gpus = count_gpus()
    if os.environ.get("N_GPUS"):
        gpus.per_node = os.environ["N_GPUS"]
        gpus.per_node_from = f"N_GPUS={gpus.per_node}"
    elif gpus.here >= 1:
        gpus.per_node = str(gpus.here)
        gpus.per_node_from = f"the GPUs this process sees ({gpus.seen})"
    else:
        gpus.per_node_from = (
            f"the config (no GPU here: {gpus.seen}; N_GPUS=... plans another layout)"
        )
    if not gpus.smi:
        fail(
            "nvidia-smi not found: verl training needs NVIDIA GPUs (a GPU node installs pip "
            "install -e '.[gpu]', docs/install.md; here --dry-run plans the run and --smoke "
            "runs the recipe on the CPU)"
        )
    elif gpus.here < 1:
        fail(f"no GPU visible ({gpus.seen})")
    return gpus


def note_no_gpu(gpus: Gpus, what: str, hint: str) -> None:
    """Dry run: the local host has no GPU for `what`, said plainly."""
    say(
        f"# dry-run: no GPU on the local host ({gpus.seen}): {what} needs NVIDIA GPUs and "
        f"would stop at once here.{' ' + hint if hint else ''}"
    )


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


# -- prerequisites ------------------------------------------------------------------------------


def verl_version() -> str | None:
    """The installed verl's version, from its metadata (no import)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_verl(launch: Launch) -> None:
    found = verl_version()
    if found is None:
        launch.fail(
            f"verl is not installed in {launch.python} (install it with: pip install "
            "'verl[verl-core]==0.9.1', or bash tools/setup.sh dev)"
        )
    elif found != "0.9.1":
        launch.fail(
            f"verl {found} is installed; entropyrl's plugin is written for verl 0.9.1 (pip "
            "install 'verl[verl-core]==0.9.1')"
        )


def preflight(launch: Launch, config: str, overrides: Sequence[str]) -> dict[str, str]:
    """Before anything starts: the recipe composed with the overrides the training command gets
    and checked, one line per problem (exit 2). A run whose checkpoint is at its last step stops
    here (exit 0), having said so."""
    if verl_version() is None:
        from entropyrl.commands.preflight import NO_VERL

        launch.fail(NO_VERL)
        say("# dry-run: the recipe's checks and the step's split need verl; skipped")
        return {}
    from entropyrl.commands import preflight as checks

    mode = "smoke" if launch.smoke else "gpu"
    status, values = checks.check(config, overrides, mode=mode, dry_run=launch.dry_run)
    if status != 0:
        raise Stop(status)
    if values.get("ER_NOTHING_TO_DO") == "1" and not launch.dry_run:
        raise Stop(0)  # the checkpoint is at the run's last step (said above)
    return values


def require_file(launch: Launch, path: str, what: str) -> None:
    if not Path(path).is_file():
        launch.fail(f"missing {path} ({what})")


def require_model(launch: Launch, model: str) -> None:
    """A local folder with config.json, or a hub id already in the local cache (training never
    downloads at run time)."""
    if Path(model).is_dir():
        if not (Path(model) / "config.json").is_file():
            launch.fail(f"model folder {model} has no config.json")
        return
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(model, local_files_only=True)
    except Exception:
        launch.fail(
            f"model {model} is neither a local folder nor in the Hugging Face cache (download "
            f"it first: hf download {model}, or set MODEL_PATH to a local folder)"
        )


def plugin_problem(python: str, *flags: str) -> str | None:
    """Whether verl loads our plugin in a fresh process (`entropyrl doctor --discovery`)."""
    result = subprocess.run(
        [python, "-m", "entropyrl", "doctor", "--discovery", *flags],
        capture_output=True,
        text=True,
    )
    if result.returncode == 0:
        return None
    problem = result.stdout.strip() or "entropyrl doctor failed"
    return f"the entropyrl verl plugin does not load: {problem} (run: {python} -m entropyrl doctor)"


# -- the smoke ----------------------------------------------------------------------------------


def smoke_plan(launch: Launch, task: str, config: str) -> list[str]:
    """--smoke, before anything else: the run's folder, its environment (set here, inherited by
    the trainer) and overrides, the asset folder named but not built yet."""
    from entropyrl.commands import smoke

    launch.out = str(Path(launch.out or f"runs/{config}_smoke").resolve())
    Path(launch.out).mkdir(parents=True, exist_ok=True)
    require_verl(launch)
    try:
        settings = smoke.default_settings(
            task, ranks=launch.ranks, model=os.environ.get("SMOKE_MODEL", "")
        )
        out = Path(launch.out)
        env, overrides = smoke.write_run_files(
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


# -- the CHAIR service --------------------------------------------------------------------------


def node_address() -> str:
    """This node's address as other nodes see it (the first that `hostname -I` lists)."""
    with contextlib.suppress(OSError):
        listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
        if listed:
            return listed[0]
    return socket.gethostbyname(socket.gethostname())


def loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


class ChairService:
    """The CHAIR service on a free port, supervised (restarted on that port if it dies), its
    output appended to `log`; `stop()` (SIGTERM to the supervisor) stops both."""

    def __init__(self, command: list[str], log: Path, ready_file: Path) -> None:
        self.command, self.log, self.ready_file = command, log, ready_file
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(self.log, "a") as handle:
            handle.write(f"== {stamp} {shlex.join(self.command)}\n")
            handle.flush()
            # the service's own output goes to its log; the supervisor's restart lines to stderr
            self.process = subprocess.Popen(self.command, stdout=handle)

    def wait_healthy(self, timeout: float) -> str | None:
        """The service's URL once it answers /health; None if it exited or `timeout` passed."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            url = self.url()
            if url and healthy(url):
                return url
            if self.process.poll() is not None or time.monotonic() >= deadline:
                return None
            time.sleep(1)

    def url(self) -> str:
        try:
            return self.ready_file.read_text().strip()
        except OSError:
            return ""

    def tail(self, lines: int = 5) -> None:
        with contextlib.suppress(OSError):
            say("\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=60)


def chair_source(launch: Launch, overrides: Sequence[str]) -> list[str]:
    """The CHAIR ground truth: CHAIR_COCO's annotations, else chair_ground_truth.json beside the
    CIDEr-D frequencies (`entropyrl prepare coco` writes both)."""
    coco = os.environ.get("CHAIR_COCO")
    if coco:
        if not Path(coco).is_dir():
            launch.fail(f"CHAIR_COCO={coco} is not a folder")
        return ["--coco", coco]
    cider = override_value(f"{_KWARGS}.cider_df", overrides)
    truth = str(Path(cider).parent / "chair_ground_truth.json")
    require_file(
        launch,
        truth,
        "CHAIR ground truth, written by entropyrl prepare coco (or set CHAIR_COCO)",
    )
    return ["--ground-truth", truth]


def start_chair(
    launch: Launch, source: list[str], values: dict[str, str], workdir: Path
) -> tuple[str, ChairService | None]:
    """The CHAIR service for this run, and the URL the reward gets. On one node it listens on
    the loopback; on several, the reward workers of every node must reach it: it listens on this
    node's address and wants the token from every client."""
    nodes = int(values.get("ER_NNODES") or 1)
    host = os.environ.get("CHAIR_HOST") or ("127.0.0.1" if nodes <= 1 else node_address())
    if not loopback(host) and not os.environ.get("CHAIR_SERVER_TOKEN"):
        launch.fail(
            f"the CHAIR service would listen on {host}, where other machines reach it ({nodes} "
            "node(s)), so it needs a token: export CHAIR_SERVER_TOKEN=<a secret> here and on "
            "every node before 'ray start' (the reward workers read it there)"
        )
    # The service's log stays in the run's folder (the checkpoint folder; a smoke's DIR),
    # appended to across resumes: what it said survives a crash.
    folder = launch.out if launch.smoke else (values.get("ER_CHECKPOINT_DIR") or ".")
    log = Path(folder) / "chair_server.log"
    command = [launch.python, "-m", "chair_server", *source, "--host", host, "--port", "0"]
    command += ["--ready-file", str(workdir / "url"), "--supervise"]
    if launch.dry_run:
        print(f"{shlex.join(command)} &", flush=True)
        return f"http://{host}:PORT", None  # the real port comes from the ready file
    service = ChairService(command, log, workdir / "url")
    service.start()
    timeout = float(os.environ.get("CHAIR_TIMEOUT") or 300)
    url = service.wait_healthy(timeout)
    if url:
        pid = service.process.pid if service.process else 0
        print(
            f"CHAIR service: {url} (supervisor pid {pid}: restarted on this port if it dies; "
            f"log: {log})",
            flush=True,
        )
        return url, service
    if os.environ.get("CHAIR_OPTIONAL") == "1":
        say(
            "warning: the CHAIR service did not come up (last lines of its log below); training "
            "continues without CHAIR scores (CHAIR_OPTIONAL=1): CIDEr-D reward only, neutral "
            "clip bounds, counted in chair/fallback_samples"
        )
        service.tail()
        # An address nothing listens on: the reward's client takes its documented fallback at
        # every batch, which the metrics count (the same path as a service that dies mid-run).
        return service.url() or "http://127.0.0.1:9", service
    service.tail()
    launch.fail(
        f"the CHAIR service did not come up within {timeout:g}s (the last lines of its log "
        "are above); CHAIR_OPTIONAL=1 trains without it (CIDEr-D reward only, neutral clip "
        "bounds, counted in chair/fallback_samples)"
    )
    return "", service


# -- training -----------------------------------------------------------------------------------


def train(launch: Launch, command: list[str]) -> int:
    """Run the training command: as it is on GPUs; in a smoke with verl's output in the run's
    log and a line per step on the terminal. A dry run prints it. After a failed run (not one
    stopped by a signal) says in one line when verl did not load the plugin."""
    if launch.dry_run:
        print(shlex.join(command), flush=True)
        return 0
    if launch.smoke:
        from entropyrl.commands.smoke import run_trainer

        status = run_trainer(command, Path(launch.out))
    else:
        process = subprocess.Popen(command)
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
    recipe = RECIPES.get(config)
    if recipe is None:
        usage_error(f"no launch recipe for {config!r}; known: {', '.join(RECIPES)}")
    trainer, own = split_command(launch.command)
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
            extra.append(f"{_KWARGS}.chair_url={url}")
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
    return status


# -- the evaluation scripts ---------------------------------------------------------------------


def option_value(command: Sequence[str], flag: str) -> str:
    """The value after the last `flag` in `command`, or empty."""
    value = ""
    for index, word in enumerate(command[:-1]):
        if word == flag:
            value = command[index + 1]
    return value


def with_option(command: Sequence[str], flag: str, value: str) -> list[str]:
    """`command` with the value after `flag` replaced."""
    words = list(command)
    words[words.index(flag) + 1] = value
    return words


def with_dry_run(command: Sequence[str], module: str) -> list[str]:
    """`command` with `--dry-run` right after `-m module` (and its action, if any)."""
    words = list(command)
    at = words.index(module) + 1
    if module == "entropyrl.commands.evaluate":
        at += 1
    return [*words[:at], "--dry-run", *words[at:]]


def read_env_file(path: Path) -> dict[str, str]:
    """`export KEY=VALUE` lines (shell-quoted values), as a smoke's smoke.env holds them."""
    values = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"] and len(words) == 2 and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def caption_evaluation(launch: Launch, passthrough: Sequence[str]) -> int:
    """examples/eval_chair_mscoco.sh: the base model and each run of RUNS that has a checkpoint
    (CKPT_ROOT/<experiment>), or with --smoke the caption smoke's checkpoint beside its base."""
    module = "entropyrl.commands.eval_caption"
    command = with_dry_run(launch.command, module) if launch.dry_run else list(launch.command)
    if launch.smoke:
        evaluate = launch.command[: launch.command.index(module) + 1]
        evaluate += ["--dry-run"] if launch.dry_run else []
        return caption_smoke_evaluation(launch, evaluate, passthrough)
    if launch.out:
        command = with_option(command, "--out", launch.out)
    data = option_value(command, "--data")
    require_file(
        launch,
        f"{data}/test.parquet",
        f"run: entropyrl prepare coco --annotations ... --images ... --out {data}",
    )
    for variable, flag in (
        ("COCO_ANNOTATIONS", "--coco"),
        ("POPE_DIR", "--pope-dir"),
        ("IMAGE_LIST", "--image-list"),
    ):
        if os.environ.get(variable):
            command += [flag, os.environ[variable]]
    root = Path(os.environ.get("CKPT_ROOT") or Path.cwd() / "checkpoints" / "entropyrl")
    default_runs = (
        "baseline=chair_mscoco_baseline entropyrl=chair_mscoco penalty=chair_mscoco_penalty"
    )
    for run in (os.environ.get("RUNS") or default_runs).split():
        name, _, experiment = run.partition("=")
        if any(root.glob(f"{experiment}/global_step_*/actor")):
            command += ["--model", f"{name}={root / experiment}"]
        else:
            say(
                f"note: no checkpoint under {root / experiment}: {name} left out (train it with "
                f"EXPERIMENT={name} bash examples/chair_mscoco.sh, trainer.save_freq > 0)"
            )
    return subprocess.run([*command, *passthrough]).returncode


def caption_smoke_evaluation(
    launch: Launch, evaluate: list[str], passthrough: Sequence[str]
) -> int:
    """--smoke: on the CPU, the caption smoke's checkpoint (SMOKE_RUN; the caption smoke runs
    first when it has none) beside its base model, on the generated world's held-out images."""
    out = launch.out or "runs/eval_chair_mscoco_smoke"
    run = os.environ.get("SMOKE_RUN") or "runs/chair_mscoco_smoke"
    if not _nonempty(Path(run, "checkpoints", "latest_checkpointed_iteration.txt")):
        trainer = [str(Path(launch.script).parent / "chair_mscoco.sh"), "--smoke", "--out", run]
        say(
            f"smoke: no caption smoke checkpoint in {run}: running bash "
            f"examples/chair_mscoco.sh --smoke --out {run} first"
        )
        if launch.dry_run:
            print(f"bash {shlex.join(trainer)}", flush=True)
        else:
            status = subprocess.run(["bash", *trainer]).returncode
            if status != 0:
                return status
    flags = ["--num-images", "0", "--backend", "transformers"]
    if not Path(run, "smoke.env").is_file():
        # a dry run before the caption smoke ran: its asset folder is not named yet
        assets = f"{run}/assets/<caption assets>"
        data = ["--data", f"{assets}/data", "--coco", f"{assets}/world"]
        models = ["--model", "base=<caption assets>/model"]
        models += ["--model", f"entropyrl={run}/checkpoints"]
        print(shlex.join([*evaluate, "--out", out, *data, *models, *flags]), flush=True)
        return 0
    env = read_env_file(Path(run, "smoke.env"))  # the data, model and environment of that run
    os.environ.update(env)
    models = ["--model", f"base={env['MODEL_PATH']}", "--model", f"entropyrl={run}/checkpoints"]
    data = ["--data", env["DATA_DIR"], "--coco", f"{env['ENTROPYRL_SMOKE_ASSETS']}/world"]
    command = [*evaluate, "--out", out, *data, *models, *flags, *passthrough]
    return subprocess.run(command).returncode


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def function_calling_evaluation(launch: Launch) -> int:
    """examples/eval_function_calling.sh: GPUs and the test split checked, then the comparison
    (`entropyrl.commands.evaluate compare`)."""
    if launch.overrides:
        launch.fail(f"unexpected arguments: {' '.join(launch.overrides)}")
    gpus = require_gpu(launch.fail)
    require_file(launch, option_value(launch.command, "--data"), "written by entropyrl prepare fc")
    command = list(launch.command)
    if launch.dry_run:
        tp = option_value(command, "--tensor-parallel-size") or "1"
        say(
            f"# dry-run: resources: generation on TP={tp} GPU(s), one model at a time ({gpus.seen})"
        )
        if gpus.here < 1:
            note_no_gpu(gpus, "generation", "")
        command = with_dry_run(command, "entropyrl.commands.evaluate")
    return subprocess.run(command).returncode


def parse_evaluation(argv: Sequence[str]) -> tuple[Launch, list[str]]:
    """The caption evaluation's flags: --smoke, --dry-run, --out DIR, --help; every other
    argument goes to `entropyrl eval caption`."""
    split = len(argv) - 1 - list(argv)[::-1].index("--")
    launch = Launch(script=argv[0], command=list(argv[split + 1 :]))
    launch.dry_run = os.environ.get("DRY_RUN", "0") == "1"
    passthrough: list[str] = []
    args = iter(argv[1:split])
    for arg in args:
        if arg == "--smoke":
            launch.smoke = True
        elif arg == "--dry-run":
            launch.dry_run = True
        elif arg == "--out":
            launch.out = next(args, None) or usage_error("--out needs a folder")
        elif arg.startswith("--out="):
            launch.out = arg[len("--out=") :]
        elif arg in ("-h", "--help"):
            print(script_help(launch.script))
            raise Stop(0)
        else:
            passthrough.append(arg)
    return launch, passthrough


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        if "entropyrl.commands.eval_caption" in argv and "--" in argv:
            return caption_evaluation(*parse_evaluation(argv))
        launch = parse(argv)
        if "entropyrl.commands.evaluate" in launch.command:
            return function_calling_evaluation(launch)
        return run(launch)
    except Stop as stop:
        return stop.status
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run a verl training command with its launch steps (what examples/*.sh call)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        prefix_chars="\0",  # every argument, flags included, belongs to the launch
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: main(args.arguments))


if __name__ == "__main__":
    sys.exit(main())
