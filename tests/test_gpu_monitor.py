"""The GPU monitor tells the SGLang server's processes from the env workers' renderers by
command line; a Snakemake command that names a `*_sglang.yaml` config is not the server."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "gpu_monitor", Path(__file__).resolve().parents[1] / "tools" / "gpu" / "gpu_monitor.py"
)
gpu_monitor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_monitor)


@pytest.mark.parametrize(
    "line",
    [
        ["/tmp/lg/bin/sglang", "serve", "--model-path", "/dev/shm/ck/cosmos3"],
        ["sglang", "serve", "--port", "30000"],
        ["python3", "-m", "sglang.launch_server", "--model-path", "m"],
        ["sgl_diffusion::scheduler_0"],
    ],
)
def test_the_server_and_its_workers_are_the_server(line):
    assert gpu_monitor.is_server_command(line)


@pytest.mark.parametrize(
    "line",
    [
        ["python3", "-m", "snakemake", "--configfile", "config/libero_pi05_openpi_sglang.yaml"],
        ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"],
        ["python3", "workflow/scripts/rollout.py", "results/h200_sglang/plan.csv"],
        [],
    ],
)
def test_a_command_that_only_names_an_sglang_file_is_not_the_server(line):
    assert not gpu_monitor.is_server_command(line)


def test_cpu_sampler_counts_an_env_worker_by_the_name_it_gives_itself():
    """Env workers rename themselves after they start (`libero-env-N`, PR_SET_NAME): a process
    first seen under its old name is still counted as an env worker once renamed."""
    import subprocess
    import sys

    import psutil

    rename = (
        "import ctypes, sys, time; sys.stdin.readline(); "
        "ctypes.CDLL('libc.so.6').prctl(15, b'libero-env-3', 0, 0, 0); "
        "print('renamed', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", rename], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        sampler = gpu_monitor.CpuSampler()
        process = psutil.Process(child.pid)
        assert sampler._kind_of(process) == "other"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "renamed"
        assert sampler._kind_of(psutil.Process(child.pid)) == "envs"
        sample = sampler.sample()
        assert {"cpu_busy", "cpu_server", "cpu_envs", "cpu_other", "server_top_threads"} <= set(
            sample
        )
        assert all(sample[key] >= 0 for key in ("cpu_server", "cpu_envs", "cpu_other"))
    finally:
        child.kill()
        child.wait()
