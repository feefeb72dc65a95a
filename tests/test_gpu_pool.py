"""Serve jobs started together take different GPUs of the pool (`serve.gpu_pool`): each holds
an flock per GPU for as long as it runs, and a job that dies, even by SIGKILL, gives its GPU
back. Real processes and real locks; the test waits for each process's own message."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from libero_eval.serve.gpu_pool import parse_pool, take_gpus, try_take


def test_servers_take_the_free_gpus_of_the_pool_in_turn(tmp_path):
    first = try_take([0, 1, 2], 1, tmp_path)
    second = try_take([0, 1, 2], 2, tmp_path)
    assert (first.ids, second.ids) == ([0], [1, 2])
    assert second.pin == [1, 2] and first.pin == 0
    assert try_take([0, 1, 2], 1, tmp_path) is None  # all held
    first.release()
    assert try_take([0, 1, 2], 1, tmp_path).ids == [0]


def test_a_killed_serve_job_gives_its_gpu_back(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from libero_eval.serve.gpu_pool import try_take
                held = try_take([0], 1, Path({str(tmp_path)!r}))
                print("held", held.ids, flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held [0]"  # the event: it holds GPU 0
    assert try_take([0], 1, tmp_path) is None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert try_take([0], 1, tmp_path).ids == [0]


def test_a_job_waiting_for_a_gpu_says_why_and_stops_when_asked(tmp_path):
    held = try_take([0], 1, tmp_path)
    said = []
    asked = iter([False, True])  # stop requested on the second wait
    assert take_gpus([0], 1, tmp_path, lambda _timeout: next(asked), said.append) is None
    assert len(said) == 1 and "--resources gpu=1" in said[0]
    held.release()
    with pytest.raises(ValueError, match="needs 2 GPUs but the pool has 1"):
        take_gpus([0], 2, tmp_path, lambda _timeout: True, said.append)


@pytest.mark.parametrize("text", ["", "a,b", "0,0", "-1"])
def test_a_bad_pool_is_refused_naming_the_flag(text):
    with pytest.raises(ValueError, match="--gpu-pool"):
        parse_pool(text)
