"""The server launcher: settings, command lines, health wait, teardown, the launch CLI.

A fake `sglang` executable (tests/fake_sglang/sglang) records its argv and environment and
serves /health, fails, or spawns process trees on demand, so every test runs real processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from libero_eval.serve.command import (
    THREAD_VARIABLES,
    build_command,
    build_env,
    pipeline_config_file,
    resolve_port,
    server_threads,
    usable_cpus,
)
from libero_eval.serve.job import load_settings
from libero_eval.serve.launcher import ManagedServer, ServerStartError
from libero_eval.serve.settings import ServerSettings, ServerSettingsError
from libero_eval.service import (
    ServiceUnavailableError,
    ServiceWaitTimeout,
    wait_for_service,
    write_service_file,
)

FAKE_DIR = Path(__file__).parent / "fake_sglang"
COSMOS3_STATS = "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"
FAKE_SGLANG = FAKE_DIR / "sglang"


def sglang_settings(**overrides: Any) -> dict[str, Any]:
    """A settings mapping for the fake sglang (fast polls, short grace)."""
    sglang = {"command": [str(FAKE_SGLANG)], "model_path": "/models/cosmos3/model_diffusers"}
    sglang.update(overrides.pop("sglang", {}))
    data = {
        "backend": "sglang",
        "slot": 2,
        "port": 0,
        "health_timeout_s": 20,
        "health_poll_s": 0.05,
        "teardown_grace_s": 1.0,
        "sglang": sglang,
    }
    data.update(overrides)
    return data


def fake_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """extra_env telling the fake where to record argv/env and pids."""
    env = {
        "FAKE_SGLANG_RECORD_FILE": str(tmp_path / "record.json"),
        "FAKE_SGLANG_PIDS_FILE": str(tmp_path / "pids.txt"),
    }
    env.update(variables)
    return env


def start_fake(tmp_path: Path, **overrides: Any) -> ManagedServer:
    server = ManagedServer(ServerSettings.from_dict(sglang_settings(**overrides)))
    with open(tmp_path / "server.log", "ab") as log:
        server.start(log)
    return server


def recorded(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "record.json").read_text())


def wait_for_pids(tmp_path: Path, count: int, timeout_s: float = 15.0) -> dict[str, int]:
    """Role -> pid of the fake's processes, once `count` of them have reported."""
    path = tmp_path / "pids.txt"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= count:
                return {role: int(pid) for role, pid in (line.split() for line in lines)}
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} processes reported in {path}")


def is_alive(pid: int) -> bool:
    """Running and not a zombie (an unreaped corpse holds no resources)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while True:
        alive = [pid for pid in pids if is_alive(pid)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def kill_leftover_fake_processes(tmp_path):
    """If a test fails half way, do not leak the fake's processes into later tests."""
    test_started = time.time() - 1.0
    yield
    pids_file = tmp_path / "pids.txt"
    if not pids_file.exists():
        return
    for line in pids_file.read_text().splitlines():
        with contextlib.suppress(psutil.Error, ValueError):
            proc = psutil.Process(int(line.split()[1]))
            if proc.create_time() >= test_started:  # not a recycled pid
                proc.kill()


# --------------------------------------------------------------------------- settings


def test_settings_defaults_apply_to_omitted_fields():
    settings = ServerSettings.from_dict(
        {"backend": "sglang", "slot": 0, "sglang": {"model_path": "/m"}}
    )
    assert settings.host == "127.0.0.1"
    assert settings.port == 0
    assert settings.health_timeout_s == 900
    assert settings.health_poll_s == 1.0
    assert settings.teardown_grace_s == 20
    assert settings.gpu_id is None
    assert settings.sglang is not None
    assert settings.sglang.command == ["sglang"]
    assert settings.sglang.pipeline_class_name == "Cosmos3OmniDiffusersPipeline"


def test_settings_ignore_the_section_of_the_other_backend():
    settings = ServerSettings.from_dict(
        {
            "backend": "reference",
            "slot": 1,
            "reference": {"policy": "hold"},
            "sglang": {"model_path": None},
        }
    )
    assert settings.reference is not None and settings.reference.policy == "hold"
    assert settings.sglang is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"backend": "vllm", "slot": 0},
            r"server\.backend: 'vllm' is not one of "
            r"\['reference', 'sglang', 'openpi', 'family', 'url'\]",
        ),
        ({"backend": "sglang", "sglang": {"model_path": "/m"}}, r"server\.slot: required"),
        ({"backend": "sglang", "slot": 0, "sglang": {}}, r"server\.sglang\.model_path: required"),
        (
            {"backend": "sglang", "slot": 0, "port": 70000, "sglang": {"model_path": "/m"}},
            r"server\.port: 70000 is greater than the maximum of 65535",
        ),
        (
            {"backend": "sglang", "slot": 0, "sglang": {"model_path": "/m"}, "gpu": 1},
            r"server\.gpu: 'gpu' was unexpected: server has no such field; did you mean "
            r"server\.gpu_id\?",
        ),
        (
            {"backend": "sglang", "slot": 0, "gpu_id": "0", "sglang": {"model_path": "/m"}},
            r"server\.gpu_id: '0' is not of type 'integer', 'array', 'null'",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "gpu_id": 0,
                "sglang": {"model_path": "/m", "num_gpus": 2, "tp_size": 2},
            },
            r"server\.gpu_id: pins 1 device\(s\) but server\.sglang\.num_gpus is 2",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "extra_args": ["--port=1"]},
            },
            r"server\.sglang\.extra_args: '--port=1' is set by the launcher",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "extra_args": ["--batching-delay-ms", "50"]},
            },
            r"server\.sglang\.extra_args: '--batching-delay-ms' is set by the launcher",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "batching_delay_ms": -5},
            },
            r"server\.sglang\.batching_delay_ms: -5 is less than the minimum of 0",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "extra_args": ["--pipeline-config-path", "p.json"]},
            },
            r"server\.sglang\.extra_args: '--pipeline-config-path': write the pipeline config's "
            r"fields in server\.sglang\.pipeline_config instead",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "pipeline_config": [1]},
            },
            r"server\.sglang\.pipeline_config: \[1\] is not of type 'object'",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "performance_mode": "x"},
            },
            r"server\.sglang\.performance_mode: 'x' is not one of \[None, 'auto'",
        ),
        (
            {
                "backend": "sglang",
                "slot": 0,
                "sglang": {"model_path": "/m", "command": ["python", "-m", "sglang.cli.main"]},
            },
            r"server\.sglang\.command: `-m sglang\.cli\.main` exits without doing anything",
        ),
        (
            {
                "backend": "reference",
                "slot": 0,
                "reference": {"policy": "hold", "max_batch_size": 0},
            },
            r"server\.reference\.max_batch_size: 0 is less than the minimum of 1",
        ),
        (
            {"backend": "sglang", "slot": 0, "health_timeout_s": 0, "sglang": {"model_path": "/m"}},
            r"server\.health_timeout_s: 0 is less than or equal to the minimum of 0",
        ),
    ],
)
def test_bad_settings_raise_errors_naming_the_field(data, message):
    with pytest.raises(ServerSettingsError, match=message):
        ServerSettings.from_dict(data)


# --------------------------------------------------------------------------- commands


@pytest.mark.parametrize(
    "family, own",
    [
        (
            "cosmos3",
            {
                "action_stats_path": COSMOS3_STATS,
                "normalization": "quantile",
                "padded_action_dim": 32,
            },
        ),
        ("pi05", {"norm_stats_path": "libero_eval:stats/pi05_libero_norm_stats.json"}),
    ],
)
def test_reference_flags_become_the_reference_servers_own_settings(family, own):
    """The serve side's `server.reference` flags and the reference server's settings are two
    ends of one command line: every configured value arrives, under its own name, the
    family's own settings too."""
    from libero_eval.reference.server import build_parser, settings_from_args

    configured = {
        "policy": "scripted",
        "max_batch_size": 3,
        "latency_fixed_s": 0.25,
        "latency_per_item_s": 0.125,
        "model_name": "reference-scripted",
        "family": family,
        "family_module": f"libero_eval.policy.families.{family}",
        "family_settings": own,
    }
    settings = ServerSettings.from_dict(
        {"backend": "reference", "slot": 0, "port": 31234, "reference": configured}
    )
    argv = build_command(settings)[3:]  # after `python -m libero_eval.reference.server`
    server = settings_from_args(build_parser().parse_args(argv))
    assert {key: getattr(server, key) for key in configured} == configured
    part = server.family_part_settings
    assert {key: getattr(part, key) for key in own} == own


def test_reference_command_passes_every_configured_flag():
    settings = ServerSettings.from_dict(
        {
            "backend": "reference",
            "slot": 0,
            "host": "127.0.0.1",
            "port": 31234,
            "reference": {
                "policy": "scripted",
                "max_batch_size": 8,
                "latency_fixed_s": 0.05,
                "latency_per_item_s": 0.01,
                "model_name": "reference-scripted",
                "family": "cosmos3",
                "family_settings": {
                    "action_stats_path": "/stats.json",
                    "normalization": "quantile_rot",
                    "padded_action_dim": 32,
                },
            },
        }
    )
    assert build_command(settings) == [
        sys.executable,
        "-m",
        "libero_eval.reference.server",
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
        "--policy",
        "scripted",
        "--max-batch-size",
        "8",
        "--latency-fixed-s",
        "0.05",
        "--latency-per-item-s",
        "0.01",
        "--model-name",
        "reference-scripted",
        "--family",
        "cosmos3",
        "--family-settings",
        '{"action_stats_path": "/stats.json", "normalization": "quantile_rot", '
        '"padded_action_dim": 32}',
    ]


def test_sglang_receives_exactly_the_expected_command_line(tmp_path):
    overrides = {
        "host": "127.0.0.1",
        "extra_env": fake_env(tmp_path),
        "sglang": {
            "num_gpus": 2,
            "tp_size": 2,
            "batching_max_size": 16,
            "batching_delay_ms": 12.5,
            "attention_backend": "flash",
            "performance_mode": "memory",
            "gpu_memory_cap_gib": 100,
            "pipeline_config": {"action_cuda_graph_max_entries": 32},
            "extra_args": ["--seed", "1140"],
        },
    }
    with start_fake(tmp_path, **overrides) as server:
        server.wait_healthy()
        port = server.settings.port
        assert port != 0
        argv = recorded(tmp_path)["argv"]
        assert server.command == [str(FAKE_SGLANG), *argv]
    # SGLang 0.5.23's diffusion server caps its CUDA allocator from this variable (GiB).
    assert recorded(tmp_path)["env"]["SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"] == "100"
    assert argv == [
        "serve",
        "--model-path",
        "/models/cosmos3/model_diffusers",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-gpus",
        "2",
        "--tp-size",
        "2",
        "--batching-max-size",
        "16",
        "--batching-delay-ms",
        "12.5",
        "--pipeline-class-name",
        "Cosmos3OmniDiffusersPipeline",
        "--input-save-path",
        "",
        "--master-port",
        str(server.settings.sglang.master_port),
        "--scheduler-port",
        str(server.settings.sglang.scheduler_port),
        "--attention-backend",
        "flash",
        "--performance-mode",
        "memory",
        "--pipeline-config-path",
        argv[-3],
        "--seed",
        "1140",
    ]
    # the pipeline config's fields reach SGLang as the JSON file it reads
    assert json.loads(Path(argv[-3]).read_text()) == {"action_cuda_graph_max_entries": 32}


def test_pipeline_config_file_is_named_by_its_content(tmp_path):
    first = pipeline_config_file({"b": [32, 64], "a": 1}, tmp_path)
    assert pipeline_config_file({"a": 1, "b": [32, 64]}, tmp_path) == first
    other = pipeline_config_file({"a": 2}, tmp_path)
    assert other != first
    assert json.loads(first.read_text()) == {"a": 1, "b": [32, 64]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])


def test_servers_started_together_get_their_own_internal_ports(tmp_path):
    """Real `sglang serve` binds its HTTP port P, P + 1 (ZMQ broker), a scheduler port and
    torch.distributed's master port (30005 by default: a second server started at the same
    time dies with EADDRINUSE). Each server gets its own, apart from every HTTP port."""
    servers, used = [], []
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        servers.append(start_fake(tmp_path / str(k), extra_env=fake_env(tmp_path / str(k))))
    try:
        for k, server in enumerate(servers):
            server.wait_healthy()
            argv = recorded(tmp_path / str(k))["argv"]
            master = int(argv[argv.index("--master-port") + 1])
            scheduler = int(argv[argv.index("--scheduler-port") + 1])
            port = server.settings.port
            assert (master, scheduler) == (
                server.settings.sglang.master_port,
                server.settings.sglang.scheduler_port,
            )
            used += [port, port + 1, master, scheduler]
    finally:
        for server in servers:
            server.stop()
    assert len(set(used)) == len(used), used


def test_configured_internal_ports_are_kept_and_not_taken_from_extra_args():
    settings = ServerSettings.from_dict(
        sglang_settings(port=31000, sglang={"master_port": 31005, "scheduler_port": 31010})
    )
    resolved = resolve_port(settings)
    assert (resolved.port, resolved.sglang.master_port, resolved.sglang.scheduler_port) == (
        31000,
        31005,
        31010,
    )
    for flag in ("--master-port", "--scheduler-port"):
        with pytest.raises(ServerSettingsError, match="set by the launcher"):
            ServerSettings.from_dict(sglang_settings(sglang={"extra_args": [flag, "1"]}))
    reference = resolve_port(
        ServerSettings.from_dict(
            {"backend": "reference", "slot": 0, "reference": {"policy": "hold"}}
        )
    )
    assert "--master-port" not in build_command(reference)


@pytest.mark.parametrize(
    ("backend", "ports"), [("reference", [30000, 30001, 30002]), ("sglang", [30000, 30002, 30004])]
)
def test_a_fixed_server_port_leaves_room_for_sglangs_broker(default_config, backend, ports):
    """server.port N: slot k listens on N + k, or N + 2k for sglang (its broker takes P + 1)."""
    from libero_eval.config_server import server_settings

    default_config["server"].update(backend=backend, port=30000, num_slots=3, cpu_threads=2)
    default_config["server"]["sglang"]["model_path"] = "/models/cosmos3"
    assert [server_settings(default_config, k).port for k in range(3)] == ports
    assert server_settings(default_config, 0).cpu_threads == 2


def test_gpu_id_pins_cuda_visible_devices_and_no_proxy_covers_loopback(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("NO_PROXY", "example.org")
    monkeypatch.delenv("no_proxy", raising=False)
    with start_fake(tmp_path, gpu_id=3, extra_env=fake_env(tmp_path, FAKE_EXTRA="x")) as server:
        server.wait_healthy()
    env = recorded(tmp_path)["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["FAKE_EXTRA"] == "x"
    for key in ("NO_PROXY", "no_proxy"):
        entries = env[key].split(",")
        assert {"example.org", "127.0.0.1", "localhost"} <= set(entries)


def test_null_gpu_id_keeps_the_environments_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with start_fake(tmp_path, gpu_id=None, extra_env=fake_env(tmp_path)) as server:
        server.wait_healthy()
    assert recorded(tmp_path)["env"]["CUDA_VISIBLE_DEVICES"] == "5"


def test_snakemakes_zero_thread_variables_become_a_positive_count(tmp_path, monkeypatch):
    """The serve rule's `threads: 0` makes Snakemake export OMP_NUM_THREADS=0 and friends;
    the server must start with a positive count instead (libgomp rejects 0)."""
    for key in THREAD_VARIABLES:
        monkeypatch.setenv(key, "0")
    with start_fake(tmp_path, extra_env=fake_env(tmp_path)) as server:
        server.wait_healthy()
    env = recorded(tmp_path)["env"]
    expected = str(max(1, min(4, usable_cpus() // 4)))
    assert {key: env[key] for key in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, expected)
    assert server.env["OMP_NUM_THREADS"] == expected


def test_thread_count_is_a_quarter_of_the_cpus_per_gpu_from_1_to_4():
    two_gpus = ServerSettings.from_dict(sglang_settings(sglang={"num_gpus": 2}))
    one_gpu = ServerSettings.from_dict(sglang_settings())
    assert server_threads(two_gpus, cpus=12) == 1
    assert server_threads(two_gpus, cpus=1) == 1
    assert server_threads(one_gpu, cpus=2) == 1  # a 2-core workstation
    assert server_threads(one_gpu, cpus=16) == 4  # one H200 node, 16 cores (measured best)
    assert server_threads(one_gpu, cpus=64) == 4
    assert build_env(two_gpus, base={})["OMP_NUM_THREADS"] == str(server_threads(two_gpus))
    assert "MKL_NUM_THREADS" not in build_env(two_gpus, base={})  # only fixed, never added


def test_eight_servers_on_a_128_core_node_leave_three_quarters_to_the_envs():
    # local Snakemake: every slot's serve job sees the whole node; 8 servers, 1 GPU each
    threads = server_threads(ServerSettings.from_dict(sglang_settings()), cpus=128)
    assert threads == 4
    assert 8 * threads <= 128 // 4  # 32 server threads, 96 cores for 128-256 env workers
    # under Slurm a slot's job gets the CPUs of its envs (16 here) and the same 4
    assert server_threads(ServerSettings.from_dict(sglang_settings()), cpus=16) * 4 <= 16


def test_configured_cpu_threads_replace_every_thread_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.setenv("MKL_NUM_THREADS", "8")
    monkeypatch.delenv("GOTO_NUM_THREADS", raising=False)
    with start_fake(tmp_path, cpu_threads=3, extra_env=fake_env(tmp_path)) as server:
        server.wait_healthy()
    env = recorded(tmp_path)["env"]
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["GOTO_NUM_THREADS"]) == (
        "3",
        "3",
        None,
    )
    with pytest.raises(
        ServerSettingsError, match=r"server\.cpu_threads: 0 is less than the minimum of 1"
    ):
        ServerSettings.from_dict(sglang_settings(cpu_threads=0))


@pytest.mark.parametrize("value", ["", "abc", "-2", "0"])
def test_invalid_thread_counts_are_replaced_and_valid_ones_kept(value):
    settings = ServerSettings.from_dict(sglang_settings())
    fixed = build_env(settings, base={"OMP_NUM_THREADS": value, "MKL_NUM_THREADS": "3"})
    assert fixed["OMP_NUM_THREADS"] == str(server_threads(settings))
    assert fixed["MKL_NUM_THREADS"] == "3"
    chosen = ServerSettings.from_dict(sglang_settings(extra_env={"OMP_NUM_THREADS": "5"}))
    assert build_env(chosen, base={"OMP_NUM_THREADS": value})["OMP_NUM_THREADS"] == "5"


def test_wildcard_hosts_are_reached_through_loopback():
    settings = ServerSettings.from_dict(sglang_settings(host="0.0.0.0", port=31000))
    assert settings.base_url == "http://127.0.0.1:31000"
    assert (
        ServerSettings.from_dict(sglang_settings(host="::1", port=5)).base_url == "http://[::1]:5"
    )


def test_settings_file_may_be_yaml(tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text("backend: reference\nslot: 3\nreference: {policy: hold, max_batch_size: 4}\n")
    settings = load_settings(argparse.Namespace(settings=None, settings_file=str(path)))
    assert settings.slot == 3
    assert settings.reference is not None and settings.reference.max_batch_size == 4


def test_a_list_of_gpu_ids_pins_several_devices():
    settings = ServerSettings.from_dict(
        sglang_settings(gpu_id=[2, 3], sglang={"num_gpus": 2, "tp_size": 2})
    )
    assert build_env(settings, base={})["CUDA_VISIBLE_DEVICES"] == "2,3"


# --------------------------------------------------------------------------- health wait


def wait_listening(server: ManagedServer) -> int:
    """The status of the first /health answer of the fake, once it listens."""
    while True:
        try:
            return requests.get(f"{server.url}/health", timeout=5).status_code
        except requests.ConnectionError:
            assert server.poll() is None, "the fake exited before it listened"
            time.sleep(0.05)


def test_ready_only_once_health_answers_200(tmp_path):
    healthy = tmp_path / "healthy"
    env = fake_env(tmp_path, FAKE_SGLANG_HEALTHY_FILE=str(healthy))
    with start_fake(tmp_path, extra_env=env) as server:
        launched_by = time.monotonic()
        # Until it is told, the fake listens but answers 503, like SGLang while loading.
        assert wait_listening(server) == 503
        released_after = time.monotonic() - launched_by
        healthy.touch()
        startup_s = server.wait_healthy()
        assert startup_s >= released_after  # counted from launch, up to the 200
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200


def test_health_deadline_raises_with_the_log_tail(tmp_path):
    # The wait starts once the fake listens (it answers 503), however long a loaded machine
    # takes to start it; the deadline counts from launch.
    env = fake_env(tmp_path, FAKE_SGLANG_NEVER_HEALTHY="1")
    before_launch = time.monotonic()
    with start_fake(tmp_path, extra_env=env, health_timeout_s=2) as server:
        assert wait_listening(server) == 503
        with pytest.raises(ServerStartError) as error:
            server.wait_healthy()
        assert time.monotonic() - before_launch >= 2  # not before the deadline
    message = str(error.value)
    assert "did not answer 200" in message
    assert "server.health_timeout_s=2" in message
    assert "HTTP 503" in message
    assert f"fake sglang: listening on 127.0.0.1:{server.settings.port}" in message


def test_server_exiting_early_fails_fast_with_code_and_output(tmp_path):
    env = fake_env(
        tmp_path,
        FAKE_SGLANG_EXIT_CODE="3",
        FAKE_SGLANG_EXIT_MESSAGE="fake sglang: CUDA out of memory on device 0",
    )
    with (
        start_fake(tmp_path, extra_env=env, health_timeout_s=600) as server,
        pytest.raises(ServerStartError) as error,
    ):
        server.wait_healthy()
    message = str(error.value)
    # it ends on the exit (the deadline's message would say "did not answer 200")
    assert "exited with code 3" in message and "after launch, before http://" in message
    assert "fake sglang: CUDA out of memory on device 0" in message
    assert str(tmp_path / "server.log") in message


def test_missing_executable_is_reported_with_the_settings_field(tmp_path):
    server = ManagedServer(
        ServerSettings.from_dict(sglang_settings(sglang={"command": [str(tmp_path / "nope")]}))
    )
    with open(tmp_path / "server.log", "ab") as log, pytest.raises(ServerStartError) as error:
        server.start(log)
    assert "server.sglang.command" in str(error.value)
    assert str(tmp_path / "nope") in str(error.value)


def test_a_configured_port_already_in_use_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = ManagedServer(ServerSettings.from_dict(sglang_settings(port=port)))
        with open(tmp_path / "server.log", "ab") as log, pytest.raises(ServerStartError) as error:
            server.start(log)
    assert f"server.port: 127.0.0.1:{port} is already in use" in str(error.value)


# --------------------------------------------------------------------------- teardown


def test_stop_kills_the_whole_tree_including_stubborn_and_escaped_processes(tmp_path):
    env = fake_env(
        tmp_path,
        FAKE_SGLANG_CHILDREN="2",
        FAKE_SGLANG_CHILDREN_IGNORE_TERM="1",
        FAKE_SGLANG_GRANDCHILD="1",
        FAKE_SGLANG_ESCAPED_CHILD="1",
    )
    server = start_fake(tmp_path, extra_env=env, teardown_grace_s=0.5)
    server.wait_healthy()
    pids = wait_for_pids(tmp_path, 5)
    assert set(pids) == {"server", "child0", "child1", "grandchild", "escaped"}
    assert os.getpgid(pids["escaped"]) != server.pgid  # it left the process group
    assert all(is_alive(pid) for pid in pids.values())

    server.stop()

    assert survivors(list(pids.values()), within_s=0.0) == []
    assert server.returncode is not None
    signalled: list[int] = []
    server._signal_all = signalled.append  # type: ignore[method-assign]
    assert server.stop() == server.returncode  # idempotent: no signal, no wait
    assert signalled == []


def test_leaving_the_context_on_an_exception_tears_the_server_down(tmp_path):
    env = fake_env(tmp_path, FAKE_SGLANG_CHILDREN="1")
    with pytest.raises(RuntimeError, match="boom"), start_fake(tmp_path, extra_env=env) as server:
        server.wait_healthy()
        pids = wait_for_pids(tmp_path, 2)
        raise RuntimeError("boom")
    assert survivors(list(pids.values()), within_s=0.0) == []


# --------------------------------------------------------------------------- launch CLI


def launch_command(tmp_path: Path, settings: dict[str, Any]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "libero_eval.serve.job",
        "--settings",
        json.dumps(settings),
        "--service-file",
        str(tmp_path / "results" / "servers" / "slot2.json"),
        "--event-log",
        str(tmp_path / "logs" / "eval_embodiment.log"),
    ]


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{FAKE_DIR}{os.pathsep}{env.get('PATH', '')}"
    return env


def wait_for_status(service_file: Path, status: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service_file.exists():
            info = json.loads(service_file.read_text())
            if info["status"] == status:
                return info
        time.sleep(0.05)
    raise AssertionError(f"{service_file} never reached status {status!r}")


def test_launch_serves_until_sigterm_then_tears_everything_down(tmp_path):
    env = fake_env(tmp_path, FAKE_SGLANG_CHILDREN="2", FAKE_SGLANG_CHILDREN_IGNORE_TERM="1")
    settings = sglang_settings(extra_env=env)
    service_file = tmp_path / "results" / "servers" / "slot2.json"
    event_log = tmp_path / "logs" / "eval_embodiment.log"
    with open(tmp_path / "serve.log", "wb") as log:
        launcher = subprocess.Popen(
            launch_command(tmp_path, settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launch_env(),
        )
    try:
        info = wait_for_status(service_file, "ready")
        assert info["slot"] == 2 and info["backend"] == "sglang"
        assert info["url"].startswith("http://127.0.0.1:")
        assert info["launcher_pid"] == launcher.pid
        assert info["pgid"] == info["pid"] == os.getpgid(info["pid"]) != os.getpgid(launcher.pid)
        assert wait_for_service(service_file, timeout_s=5, poll_s=0.05) == info
        pids = wait_for_pids(tmp_path, 3)
        assert pids["server"] == info["pid"]

        lines = event_log.read_text().splitlines()
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[serve slot=2\] "
        assert len(lines) == 3
        assert re.fullmatch(stamp + r"server launch: .*/fake_sglang/sglang serve .*", lines[0])
        # the fake logs none of SGLang's start lines: no parts, only the serve job's times
        started = r"server start: \d+\.\d s to ready \(\d+\.\d s to healthy\)"
        assert re.fullmatch(stamp + started, lines[1])
        assert re.fullmatch(
            stamp + re.escape(f"server ready: {info['url']} (") + r"\d+\.\d s\)", lines[2]
        )

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=15) == 0
    finally:
        launcher.kill()
        launcher.wait()
    assert survivors(list(pids.values()), within_s=0.0) == []
    assert json.loads(service_file.read_text())["status"] == "stopped"
    assert "server stopped: received SIGTERM" in event_log.read_text().splitlines()[-1]
    assert "fake sglang: listening on" in (tmp_path / "serve.log").read_text()


def test_launcher_dies_with_its_parent_and_takes_the_server_along(tmp_path):
    env = fake_env(tmp_path, FAKE_SGLANG_CHILDREN="1", FAKE_SGLANG_CHILDREN_IGNORE_TERM="1")
    settings = sglang_settings(extra_env=env)
    service_file = tmp_path / "results" / "servers" / "slot2.json"
    # A stand-in for Snakemake: spawns the launcher and waits on it.
    parent_code = (
        "import subprocess, sys; "
        "p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); p.wait()"
    )
    with open(tmp_path / "serve.log", "wb") as log:
        parent = subprocess.Popen(
            [sys.executable, "-c", parent_code, *launch_command(tmp_path, settings)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=launch_env(),
        )
    launcher_pid = int(parent.stdout.readline())
    try:
        wait_for_status(service_file, "ready")
        pids = wait_for_pids(tmp_path, 2)
        parent.kill()  # kill -9 of "snakemake"
        parent.wait()
        assert survivors([launcher_pid, *pids.values()], within_s=10.0) == []
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(launcher_pid, signal.SIGTERM)  # only reached alive if the test failed
    assert json.loads(service_file.read_text())["status"] == "stopped"


def test_a_server_outlives_no_launcher_killed_with_sigkill(tmp_path):
    settings = sglang_settings(extra_env=fake_env(tmp_path))
    service_file = tmp_path / "results" / "servers" / "slot2.json"
    launcher = subprocess.Popen(
        launch_command(tmp_path, settings), stdout=subprocess.DEVNULL, env=launch_env()
    )
    try:
        server_pid = wait_for_status(service_file, "ready")["pid"]
        launcher.kill()  # no teardown can run: the server's own PR_SET_PDEATHSIG must act
        launcher.wait()
        assert survivors([server_pid], within_s=5.0) == []
    finally:
        launcher.kill()
        launcher.wait()


def test_launch_reports_a_server_that_fails_to_start(tmp_path):
    env = fake_env(tmp_path, FAKE_SGLANG_EXIT_CODE="3", FAKE_SGLANG_EXIT_MESSAGE="no weights")
    service_file = tmp_path / "results" / "servers" / "slot2.json"
    result = subprocess.run(
        launch_command(tmp_path, sglang_settings(extra_env=env)),
        capture_output=True,
        text=True,
        env=launch_env(),
        timeout=60,
    )
    assert result.returncode == 1
    assert "exited with code 3" in result.stderr
    info = json.loads(service_file.read_text())
    assert info["status"] == "failed"
    assert "exited with code 3" in info["error"]
    with pytest.raises(ServiceUnavailableError, match="is failed: .*exited with code 3"):
        wait_for_service(service_file, timeout_s=5, poll_s=0.05)
    last = (tmp_path / "logs" / "eval_embodiment.log").read_text().splitlines()[-1]
    assert "[serve slot=2] server failed: sglang server (slot 2) exited with code 3" in last


def test_launch_reports_a_server_that_dies_while_serving(tmp_path):
    die = tmp_path / "die"
    env = fake_env(tmp_path, FAKE_SGLANG_DIE_FILE=str(die))
    service_file = tmp_path / "results" / "servers" / "slot2.json"
    with open(tmp_path / "serve.log", "w") as log:
        launcher = subprocess.Popen(
            launch_command(tmp_path, sglang_settings(extra_env=env)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launch_env(),
        )
    try:
        wait_for_status(service_file, "ready")
        die.touch()  # the fake crashes once it is serving
        assert launcher.wait(timeout=60) == 1
    finally:
        launcher.kill()
        launcher.wait()
    serve_log = (tmp_path / "serve.log").read_text()
    # The failure report quotes the tail of the server's output (the same log).
    assert "exited with code 4 while serving" in serve_log
    assert serve_log.count("fake sglang: crashed while serving") == 2
    assert json.loads(service_file.read_text())["status"] == "failed"


def test_launch_rejects_bad_settings_with_exit_code_2(tmp_path):
    result = subprocess.run(
        launch_command(tmp_path, {"backend": "sglang", "slot": 0, "sglang": {}}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "server.sglang.model_path: required with server.backend sglang" in result.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("port", 70000, "server.port: 70000 is greater than the maximum of 65535"),
        ("reference", {"policy": "bogus"}, "server.reference.policy: 'bogus' is not one of"),
        ("reference", {"policy": "hold", "max_batch_size": 0}, "server.reference.max_batch"),
    ],
)
def test_launch_rejects_a_value_the_schema_refuses_naming_the_field(
    tmp_path, field, value, message
):
    """The serve job checks the settings it shares with the config against the schema's
    `server` subschema first: jsonschema's message, naming the field, and exit code 2."""
    settings = {"backend": "reference", "slot": 0, "reference": {"policy": "hold"}, field: value}
    result = subprocess.run(
        launch_command(tmp_path, settings), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "results" / "servers" / "slot2.json").exists()


# --------------------------------------------------------------------------- wait_for_service


def test_wait_for_service_times_out_naming_the_file_and_the_serve_log(tmp_path):
    service_file = tmp_path / "slot0.json"
    started = time.monotonic()
    with pytest.raises(ServiceWaitTimeout) as error:
        wait_for_service(service_file, timeout_s=0.5, poll_s=0.05, log_path="logs/serve/slot0.log")
    assert time.monotonic() - started >= 0.5  # not before its timeout
    message = str(error.value)
    assert str(service_file) in message
    assert "the file does not exist yet" in message
    assert "logs/serve/slot0.log" in message


def test_wait_for_service_keeps_waiting_while_the_server_is_starting(tmp_path):
    service_file = tmp_path / "slot0.json"
    write_service_file(service_file, {"slot": 0, "url": "http://127.0.0.1:9", "status": "starting"})
    with pytest.raises(ServiceWaitTimeout, match="status is 'starting'"):
        wait_for_service(service_file, timeout_s=0.3, poll_s=0.05)
