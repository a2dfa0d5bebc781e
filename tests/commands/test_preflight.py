"""The launch scripts' pre-flight reads the config verl would train with, and decides as verl does.

`entropyrl.commands.preflight` composes a recipe without importing verl (so a refusal takes about a
second, not ten): the same folder of verl's configs as a file path instead of `pkg://`. These
tests hold it to verl: the composed config equals what `main_ppo`'s composition gives, and the
roles it derives (reference policy, critic) are those verl's own functions give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from entropyrl.commands import preflight
from entropyrl.verl.checks import layout, stack

RECIPES = ("chair_mscoco", "egpo_function_calling", "grpo_function_calling", "egpo_ratio_mixed")


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipe_composes_as_main_ppo_composes_it(compose, name):
    overrides = ["trainer.nnodes=2", "++algorithm.clip_schedule.low=0.25"]
    ours = preflight.compose_recipe(name, overrides)
    verls = compose(name, overrides)  # the recipe's own pkg://verl.trainer.config search path
    assert OmegaConf.to_container(ours, resolve=True) == OmegaConf.to_container(verls, resolve=True)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["actor_rollout_ref.actor.use_kl_loss=false"],
        ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"],
        ["critic.enable=true"],
        ["algorithm.adv_estimator=gae"],
        ["algorithm.adv_estimator=gae", "critic.enable=false"],
    ],
)
def test_roles_are_those_verl_derives(compose, overrides):
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    config = compose("chair_mscoco", overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # need_critic warns when it says no
        expected = (bool(need_reference_policy(config)), bool(need_critic(config)))
    assert preflight.run_roles(config) == expected


def test_an_unknown_recipe_names_the_known_ones():
    with pytest.raises(ValueError) as error:
        preflight.config_path("chair")
    assert str(error.value) == (
        "no recipe 'chair': give one of chair_mscoco, egpo_function_calling, egpo_ratio_mixed, "
        "grpo_function_calling or a path to a .yaml config"
    )
    assert preflight.config_path("chair_mscoco").name == "chair_mscoco.yaml"


def test_verl_pins_are_read_from_verls_metadata():
    pins = stack.verl_pins("vllm")
    assert stack._pin(pins["torch"]) == "==2.11.0"
    assert stack._pin(pins["vllm"]) == "==0.24.0"
    assert stack._pin(pins["transformers"]) == "==5.9.0"
    assert not pins["transformers"].contains("5.10.4")
    base = stack.verl_pins("verl-core")
    assert base["transformers"].contains("5.10.4") and not base["transformers"].contains("5.11.0")


def test_flash_attn_is_needed_by_the_default_attention_and_by_qwen2_vl_remove_padding(
    compose, tmp_path
):
    config = compose("chair_mscoco")
    assert "flash_attention_2" in stack.attention_needs_flash(config)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    sdpa = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    packed = compose("chair_mscoco", [sdpa, f"actor_rollout_ref.model.path={model}"])
    assert "flash_attn_varlen_func" in stack.attention_needs_flash(packed)
    padded = compose(
        "chair_mscoco",
        [
            sdpa,
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.model.use_remove_padding=false",
        ],
    )
    assert stack.attention_needs_flash(padded) is None
    text = compose("egpo_function_calling", [sdpa])  # Qwen3 text: verl patches no attention
    assert stack.attention_needs_flash(text) is None


def test_filesystem_type_reads_the_longest_mount_point(tmp_path):
    assert layout.filesystem_type(Path("/proc/self")) == "proc"
    kind = layout.filesystem_type(tmp_path / "not" / "there")
    assert kind == layout.filesystem_type(tmp_path) and kind is not None


def test_gpu_findings_say_what_the_process_sees(compose, monkeypatch):
    config = compose("chair_mscoco")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    (few,) = layout.gpu_findings(config, visible=2)
    assert not few.ok
    assert few.line == (
        "GPUs: 2 visible (CUDA_VISIBLE_DEVICES=0,1), the recipe uses 8 per node: set "
        "trainer.n_gpus_per_node=2 (or N_GPUS), or make more GPUs visible"
    )
    (enough,) = layout.gpu_findings(config, visible=8)
    assert enough.ok


# -- the CUDA stack: the driver against torch's build, and the image libraries -------------------


def fake_nvidia_smi(tmp_path: Path, monkeypatch, driver: str, gpus: int = 8) -> None:
    """`nvidia-smi` answering as a node of `gpus` H100s with NVIDIA driver `driver` does."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    names = "\\n".join(["NVIDIA H100 80GB HBM3"] * gpus)
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in *driver_version*) echo "' + driver + '" ;; '
        '*) printf "' + names + '\\n" ;; esac\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")


CUDA12 = "550.54.15"  # an R550 driver: CUDA 12.4, the fleet's usual H100 driver
CUDA13 = "580.65.06"  # the oldest R580 driver, CUDA 13.0's minimum


def test_the_install_route_follows_the_driver():
    """R580+: the PyPI route; a CUDA 12 driver: the CUDA 12.9 builds (never `.[gpu]`, whose
    torch is a CUDA 13 build); older: an upgrade, or the container where forward compatibility
    holds."""
    cuda12 = stack.gpu_install_for(CUDA12)
    assert "route (b)" in cuda12 and "whl/cu129" in cuda12 and "route (c)" in cuda12
    assert ".[gpu]" not in cuda12
    assert stack.gpu_install_for("525.60.13").startswith("NVIDIA driver 525.60.13 is a CUDA 12")
    cuda13 = stack.gpu_install_for(CUDA13)
    assert cuda13.startswith("route (a)") and "pip install -e '.[gpu]'" in cuda13
    old = stack.gpu_install_for("520.61.05")  # no pip route works there
    assert "upgrade it" in old and "route (c)" in old
    assert "whl/cu129" not in old and ".[gpu]" not in old
    assert "whl/cu129" in stack._torchvision_install(CUDA12)  # not PyPI's CUDA 13 build
    assert "whl/cu129" not in stack._torchvision_install(CUDA13)
    assert stack.gpu_install_for(None) == stack.GPU_INSTALL
    assert stack.gpu_install_for("garbled") == stack.GPU_INSTALL


def test_a_driver_too_old_for_torchs_cuda_is_refused_with_the_route():
    (old,) = stack.driver_findings(CUDA12, "2.11.0", "13.0", sees_gpu=False)
    assert not old.ok and old.blocking
    assert old.line == (
        "NVIDIA driver 550.54.15, torch 2.11.0 built for CUDA 13.0: CUDA 13 needs driver "
        "580.65.6 or newer (the R580 series); with this driver torch sees no GPU: "
        + stack.gpu_install_for(CUDA12)
    )
    assert ".[gpu]" not in old.line
    (compat,) = stack.driver_findings(CUDA12, "2.11.0", "13.0", sees_gpu=True)
    assert compat.ok and "forward-compatibility" in compat.line  # route (c) on R550
    (a,) = stack.driver_findings(CUDA13, "2.11.0", "13.0")
    assert a.ok and a.line.endswith("(route (a))")
    (b,) = stack.driver_findings(CUDA12, "2.11.0+cu129", "12.9")
    assert b.ok and b.line.endswith("(route (b))")
    assert not stack.driver_findings("520.61.05", "2.11.0", "12.8")[0].ok
    assert stack.driver_findings(None, "2.11.0", "13.0") == []  # no driver: nothing to judge


def test_the_driver_is_read_from_nvidia_smi(tmp_path, monkeypatch):
    """The real query path with a stand-in `nvidia-smi`; this machine's torch is a CPU build,
    which a node with a driver must not keep."""
    fake_nvidia_smi(tmp_path, monkeypatch, CUDA12)
    assert stack.nvidia_driver() == CUDA12
    version, cuda = stack.torch_build()
    assert cuda is None  # the CPU wheel
    (finding,) = stack.driver_findings(stack.nvidia_driver(), version, cuda)
    assert finding.line == (
        f"torch {version} is a CPU build on a node with NVIDIA driver 550.54.15: "
        + stack.gpu_install_for(CUDA12)
    )


@pytest.mark.parametrize(
    ("driver", "route", "absent"),
    [(CUDA12, "route (b)", ".[gpu]"), (CUDA13, "route (a)", ".[preinstalled]")],
)
def test_the_dry_run_names_the_route_of_the_nodes_driver(
    tmp_path, monkeypatch, capsys, driver, route, absent
):
    """8 H100s with a CUDA 12 driver: every install the dry run names is route (b) or (c)."""
    fake_nvidia_smi(tmp_path, monkeypatch, driver)
    preflight.main(["chair_mscoco", "--dry-run"])
    stops = [line for line in capsys.readouterr().err.splitlines() if "would stop" in line]
    assert stops and any(route in line for line in stops), stops
    assert not any(absent in line for line in stops), stops


def test_an_image_model_through_verls_dataset_needs_torchvision_and_qwen_vl_utils(
    compose, tmp_path, monkeypatch
):
    import importlib.util

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    cfg = compose("chair_mscoco", [f"actor_rollout_ref.model.path={model}"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("torchvision", "qwen_vl_utils") else real(name, *a),
    )
    lines = [f.line for f in stack.vision_stack_findings(cfg) if not f.ok]
    assert lines == [
        "torchvision: not installed, and verl's dataset and agent loop read qwen2_5_vl's images "
        "through qwen_vl_utils: pip install torchvision==0.26.0 (verl 0.9.1's pin, with torch "
        "2.11)",
        "qwen_vl_utils: not installed, and verl's dataset and agent loop read qwen2_5_vl's "
        "images through qwen_vl_utils: pip install qwen-vl-utils",
    ]
    pillow = compose(
        "chair_mscoco",
        [
            f"actor_rollout_ref.model.path={model}",
            "data.custom_cls.path=pkg://entropyrl.rig.dataset",
            "data.custom_cls.name=PillowRLHFDataset",
        ],
    )
    assert stack.vision_stack_findings(pillow) == []  # the CPU smoke's dataset needs neither
    text = compose("egpo_function_calling")
    assert stack.vision_stack_findings(text) == []


# -- names verl does not know ---------------------------------------------------------------------


def test_the_names_read_before_verl_loads_are_its_registries():
    """The preflight does not import verl: it reads verl's registrations from its source. In a
    fresh process (no verl) that reading must give exactly the registries `import verl` fills
    (with the plugin's names)."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from entropyrl.verl.checks.validation import registered_names\n"
        "estimators, losses = registered_names()\n"
        "assert 'verl' not in sys.modules\n"
        "print(json.dumps([sorted(estimators), sorted(losses)]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    read = json.loads(result.stdout)
    from verl.trainer.ppo import core_algos

    import entropyrl.verl.plugin  # noqa: F401  (the plugin's registrations)

    assert read == [
        sorted(core_algos.ADV_ESTIMATOR_REGISTRY),
        sorted(core_algos.POLICY_LOSS_REGISTRY),
    ]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algorithm.adv_estimator=egpo-ratio", "algorithm.adv_estimator=egpo-ratio is not"),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=per-sample-clip",
            "actor_rollout_ref.actor.policy_loss.loss_mode=per-sample-clip is not",
        ),
    ],
)
def test_a_name_verl_does_not_know_is_refused_before_anything_starts(override, expected, capsys):
    code = preflight.main(["chair_mscoco", "--mode", "smoke", "--dry-run", "--", override])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    assert len(errors) == 1 and errors[0].startswith(f"error: {expected} registered with verl")
    assert "egpo_ratio" in errors[0] or "per_sample_clip" in errors[0]  # the known ones listed
