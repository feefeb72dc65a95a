"""rollout.render_device: a GPU is mapped to its EGL device by identity, and the variables that
robosuite reads are checked at env start. The device lists are fakes of a 4-GPU node whose EGL
order differs from nvidia-smi's (as it can on real nodes)."""

from __future__ import annotations

import pytest

from libero_eval.rollout.render_device import (
    EXPECTED_DEVICE_VARIABLE,
    EglDevice,
    GpuDevice,
    RenderDeviceError,
    check_render_env,
    normalize_pci_bus_id,
    plan_render_env,
    robosuite_egl_index,
)

GPUS = [
    GpuDevice(0, "GPU-00000000-0000-0000-0000-00000000000a", "0000:1b:00.0"),
    GpuDevice(1, "GPU-11111111-0000-0000-0000-00000000000b", "0000:43:00.0"),
    GpuDevice(2, "GPU-22222222-0000-0000-0000-00000000000c", "0000:52:00.0"),
    GpuDevice(3, "GPU-33333333-0000-0000-0000-00000000000d", "0000:9d:00.0"),
]
# EGL lists the GPUs in another order, identified by UUID; then Mesa's software device.
EGL_BY_UUID = [
    EglDevice(0, uuid=GPUS[2].uuid),
    EglDevice(1, uuid=GPUS[0].uuid),
    EglDevice(2, uuid=GPUS[3].uuid),
    EglDevice(3, uuid=GPUS[1].uuid),
    EglDevice(4, software=True),
]
# An older driver: no persistent id, only the DRM node's PCI address (sysfs spelling).
EGL_BY_PCI = [
    EglDevice(0, pci_bus_id="0000:9d:00.0"),
    EglDevice(1, pci_bus_id="0000:52:00.0"),
    EglDevice(2, pci_bus_id="0000:43:00.0"),
    EglDevice(3, pci_bus_id="0000:1b:00.0"),
]


def plan(choice, egl=EGL_BY_UUID, **kwargs):
    defaults = {"mujoco_gl": "egl", "slot_gpu_ids": None, "backend": "sglang", "environ": {}}
    defaults.update(kwargs)
    return plan_render_env(
        choice,
        list_gpus=lambda: GPUS,
        list_egl=lambda: egl,
        mesa_vendor_files=lambda: ["/usr/share/glvnd/egl_vendor.d/50_mesa.json"],
        **defaults,
    )


@pytest.mark.parametrize(
    ("slot_gpu_ids", "egl", "egl_index"),
    [([1], EGL_BY_UUID, 3), ([3], EGL_BY_UUID, 2), ([1], EGL_BY_PCI, 2), (0, EGL_BY_PCI, 3)],
)
def test_slot_gpu_renders_on_the_egl_device_that_is_that_gpu(slot_gpu_ids, egl, egl_index):
    env = plan("slot_gpu", egl=egl, slot_gpu_ids=slot_gpu_ids).env
    assert env["MUJOCO_GL"] == env["PYOPENGL_PLATFORM"] == "egl"
    assert env["MUJOCO_EGL_DEVICE_ID"] == str(egl_index)
    # robosuite's assert: the EGL id must appear in CUDA_VISIBLE_DEVICES
    assert env["CUDA_VISIBLE_DEVICES"] == str(egl_index)
    check_render_env(env, list_egl=lambda: egl)


def test_under_slurm_the_slot_gpu_is_the_jobs_allocation_even_as_a_uuid():
    by_index = plan("auto", environ={"CUDA_VISIBLE_DEVICES": "3,1"}).env
    assert by_index["MUJOCO_EGL_DEVICE_ID"] == "2"
    by_uuid = plan("slot_gpu", environ={"CUDA_VISIBLE_DEVICES": "GPU-11111111"}).env
    assert by_uuid["MUJOCO_EGL_DEVICE_ID"] == "3"


def test_a_fixed_device_index_is_a_gpu_index_mapped_the_same_way():
    assert plan(0, egl=EGL_BY_PCI).env["MUJOCO_EGL_DEVICE_ID"] == "3"


def test_cpu_hides_the_gpus_and_renders_with_mesa():
    egl_env = plan("cpu").env
    assert egl_env["__EGL_VENDOR_LIBRARY_FILENAMES"].endswith("50_mesa.json")
    # Mesa lists its software device first; robosuite's assert wants the id in CUDA's list.
    assert egl_env["MUJOCO_EGL_DEVICE_ID"] == egl_env["CUDA_VISIBLE_DEVICES"] == "0"
    osmesa_env = plan("cpu", mujoco_gl="osmesa").env
    assert osmesa_env["MUJOCO_GL"] == osmesa_env["PYOPENGL_PLATFORM"] == "osmesa"
    check_render_env(egl_env, list_egl=lambda: [EglDevice(0, software=True)])
    with pytest.raises(RenderDeviceError, match="cpu, but EGL device 0 is #0 PCI 0000:9d"):
        check_render_env(egl_env, list_egl=lambda: EGL_BY_PCI)


def test_the_reference_backend_keeps_the_egl_defaults():
    assert plan("auto", backend="reference").env == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choice": "slot_gpu"}, r"slot_gpu, but this job has no GPU"),
        ({"choice": 7}, r"GPU '7' is not one of the GPUs nvidia-smi lists"),
        ({"choice": 1, "mujoco_gl": "osmesa"}, r"rollout.mujoco_gl is 'osmesa'"),
        ({"choice": 1, "egl": [EglDevice(0, software=True)]}, r"no EGL device is GPU 1"),
        ({"choice": "gpu0"}, r"'gpu0' is not one of auto, slot_gpu, cpu"),
    ],
)
def test_an_unusable_choice_is_a_clear_error(kwargs, message):
    choice = kwargs.pop("choice")
    with pytest.raises(RenderDeviceError, match=message):
        plan(choice, **kwargs)


def test_the_check_at_env_start_names_the_variables_that_pick_another_device():
    env = plan("slot_gpu", slot_gpu_ids=[1]).env
    # EGL's order is not the same in the worker (another driver state): the check refuses.
    with pytest.raises(RenderDeviceError, match=r"not the planned .* MUJOCO_EGL_DEVICE_ID='3'"):
        check_render_env(env, list_egl=lambda: EGL_BY_PCI)
    with pytest.raises(RenderDeviceError, match=r"EGL device 3 does not exist.*CUDA_VISIBLE_DEV"):
        check_render_env(env, list_egl=lambda: EGL_BY_UUID[:2])
    robosuite_would_assert = {**env, "CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(RenderDeviceError, match=r"does not appear in CUDA_VISIBLE_DEVICES"):
        check_render_env(robosuite_would_assert, list_egl=lambda: EGL_BY_UUID)
    with pytest.raises(RenderDeviceError, match=r"PYOPENGL_PLATFORM=egl"):
        check_render_env({**env, "PYOPENGL_PLATFORM": "osmesa"}, list_egl=lambda: EGL_BY_UUID)
    assert EXPECTED_DEVICE_VARIABLE in env


def test_robosuite_reads_cuda_visible_devices_as_an_egl_index_when_no_id_is_set():
    assert robosuite_egl_index({}) == 0
    assert robosuite_egl_index({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    with pytest.raises(RenderDeviceError, match="CUDA_VISIBLE_DEVICES='' as an EGL device"):
        robosuite_egl_index({"CUDA_VISIBLE_DEVICES": ""})  # robosuite: int('') fails
    with pytest.raises(RenderDeviceError, match="CUDA_VISIBLE_DEVICES='GPU-1234'"):
        robosuite_egl_index({"CUDA_VISIBLE_DEVICES": "GPU-1234"})


def test_pci_bus_ids_compare_across_spellings():
    assert normalize_pci_bus_id("00000000:1B:00.0") == normalize_pci_bus_id("0000:1b:00.0")
    assert normalize_pci_bus_id("1b:00.0") == "0000:1b:00.0"


@pytest.mark.libero
def test_env_workers_render_where_the_plan_says_or_fail_naming_the_variables():
    """A real env worker: the cpu plan renders (llvmpipe here); a device that EGL does not
    list fails the episode at env start with the variables named."""
    from libero_eval.rollout.env_worker import EnvWorker
    from libero_eval.rollout.libero_env import EnvSettings, EpisodeSpec
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    protocol = get_protocol("openpi", max_steps_override=1)
    cases = {
        "cpu": plan_render_env("cpu", mujoco_gl="egl", slot_gpu_ids=None, backend="sglang").env,
        "missing": {"MUJOCO_GL": "egl", "MUJOCO_EGL_DEVICE_ID": "7", "CUDA_VISIBLE_DEVICES": "7"},
    }
    replies = {}
    for name, render_env in cases.items():
        settings = build(
            EnvSettings, "rollout", camera_size=32, render_mode="every_step", render_env=render_env
        )
        worker = EnvWorker(0, settings, protocol)
        try:
            worker.send("start", EpisodeSpec("libero_spatial", 0, 0))
            replies[name] = worker.receive()
        finally:
            worker.stop()
    status, observation = replies["cpu"]
    assert status == "ok", str(observation)[-1500:]
    assert observation.agentview.shape == (32, 32, 3) and observation.agentview.any()
    status, message = replies["missing"]
    assert status == "error"
    assert "EGL device 7 does not exist" in message and "MUJOCO_EGL_DEVICE_ID='7'" in message


def test_a_rollout_job_plans_its_slots_gpu_from_the_config(default_config, monkeypatch):
    """config -> slot -> GPU -> EGL device, as run_shard_job does before any env starts."""
    import libero_eval.rollout.render_device as render_device
    from libero_eval.config import RunSettings

    monkeypatch.setattr(render_device, "query_gpus", lambda: GPUS)
    monkeypatch.setattr(render_device, "query_egl_devices", lambda: EGL_BY_UUID)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = default_config
    config["server"].update(backend="sglang", num_slots=2, gpu_ids=[1, 3])
    plan = RunSettings(config).render_plan(slot=1)  # slot 1 serves on GPU 3 = EGL device 2
    assert plan.env["MUJOCO_EGL_DEVICE_ID"] == "2"
    settings = RunSettings(config).shard_settings("shard001", 1, 2, render=plan)
    assert settings.env.render_env == plan.env
    config["rollout"]["render_device"] = "cpu"
    assert RunSettings(config).render_plan(slot=1).env["LIBERO_EVAL_RENDER_DEVICE"] == "software"


@pytest.mark.parametrize(
    "name",
    [
        "libero_spatial_cosmos3_sglang.yaml",
        "libero_pi05_sglang.yaml",
        "libero_pi05_openpi_sglang.yaml",
        "libero_pi05_openpi.yaml",
    ],
)
def test_the_selftest_overlay_on_a_gpu_config_renders_on_a_machine_without_gpus(name, monkeypatch):
    """`--configfile config/<gpu config> config/selftest.yaml` is documented to run on a CPU:
    the overlay's reference server has no GPU, so a GPU config's `render_device: slot_gpu`
    must not survive it (it refused every shard: "this job has no GPU")."""
    from test_pi05_config import REPO, checked, merged

    import libero_eval.rollout.render_device as render_device
    from libero_eval.config import RunSettings

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(render_device, "query_gpus", lambda: [])
    monkeypatch.setattr(render_device, "query_egl_devices", lambda: [EglDevice(0, software=True)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = checked(merged(REPO / "config" / name, REPO / "config" / "selftest.yaml"))
    assert config["server"]["backend"] == "reference"
    plan = RunSettings(config).render_plan(slot=0)
    assert "MUJOCO_EGL_DEVICE_ID" not in plan.env, plan


@pytest.mark.libero
def test_env_workers_run_at_the_configured_niceness():
    """rollout.env_niceness: a worker lowers its own CPU priority before it builds its env, so
    a policy server sharing the cores runs first; 0 leaves it at the shard's."""
    import os

    from libero_eval.rollout.env_worker import EnvWorker
    from libero_eval.rollout.libero_env import EnvSettings
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    protocol = get_protocol("openpi", max_steps_override=1)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}
    for niceness in (0, 7):
        worker = EnvWorker(
            0, build(EnvSettings, "rollout", camera_size=32, env_niceness=niceness), protocol
        )
        try:
            worker.send("chunk", None)  # no episode started: an error reply, from the loop
            status, _ = worker.receive()
            assert status == "error"
            seen[niceness] = os.getpriority(os.PRIO_PROCESS, worker.process.pid)
        finally:
            worker.stop()
    assert seen == {0: mine, 7: min(mine + 7, 19)}
