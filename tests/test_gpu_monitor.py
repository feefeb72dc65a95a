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
