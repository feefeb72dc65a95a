"""A server's start, part by part, from its own log (`libero_eval.serve.startup`), read from
real serve logs (tests/fixtures/serve_logs, README there) and from hand-made lines."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from libero_eval.serve.startup import (
    denoise_graphs_captured,
    describe_parts,
    read_startup_parts,
    startup_parts,
)

LOGS = Path(__file__).parent / "fixtures" / "serve_logs"


def local(stamp: str) -> float:
    """Epoch seconds of a local time ``YYYY-mm-dd HH:MM:SS[.f]``."""
    whole, _, fraction = stamp.partition(".")
    moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return time.mktime(moment.timetuple()) + float(f"0.{fraction or 0}")


def test_sglangs_own_lines_split_a_real_cosmos3_start_into_its_parts():
    # the serve job spawned it at 14:16:37.4 and saw /health 200 at 14:18:25.0 (README)
    launch, healthy = local("2026-12-03 14:16:37.4"), local("2026-12-03 14:18:25.0")
    parts = read_startup_parts(LOGS / "sglang_cosmos3_tiny_cpu.log", launch, healthy)
    assert parts == {
        "process_start": 44.6,  # to "[12-03 14:17:22] Starting server..."
        "workers_start": 34.0,  # to "[12-03 14:17:56] Loading pipeline modules..."
        "weights": 4.0,  # to "[12-03 14:18:00] Pipeline instantiated"
        "http_start": 2.0,  # to "[2026-12-03 14:18:02] INFO: Uvicorn running on ..."
        "warmup": 22.0,  # to "[12-03 14:18:24] The server is fired up and ready to roll!"
        "health": 1.0,  # to the serve job's /health 200
    }
    assert sum(parts.values()) == pytest.approx(healthy - launch)
    assert describe_parts(parts) == (
        "process start 44.6 s, workers 34.0 s, weights 4.0 s, HTTP server 2.0 s, "
        "SGLang warm-up 22.0 s, until /health 1.0 s"
    )


def test_a_server_without_sglangs_warmup_goes_from_its_http_start_to_health():
    # π0.5 (a VLA action task) has no synthetic warm-up: no "fired up" line
    text = "\n".join(
        [
            "[12-02 04:26:30] Starting server...",
            "[12-02 04:26:41] Loading pipeline modules...",
            "[12-02 04:27:19] Pi05 memory config: prefix_cache=False/1, cuda_graph=prefix:True/1",
            "[12-02 04:27:20] Pipeline instantiated",
            "[2026-12-02 04:27:22] INFO:     Uvicorn running on http://127.0.0.1:1 (Press CTRL",
        ]
    )
    launch = local("2026-12-02 04:26:22.5")
    parts = startup_parts(text, launch, local("2026-12-02 04:27:23.2"))
    assert parts == {
        "process_start": 7.5,
        "workers_start": 11.0,
        "weights": 39.0,
        "http_start": 2.0,
        "health": 1.2,
    }


def test_a_missing_line_leaves_out_the_parts_on_both_sides_never_guesses():
    text = "[12-02 04:26:30] Starting server...\n[12-02 04:27:20] Pipeline instantiated\n"
    launch = local("2026-12-02 04:26:22")
    parts = startup_parts(text, launch, local("2026-12-02 04:27:30"))
    # "Loading pipeline modules..." is missing: workers and weights unknown; no HTTP line
    # either, so nothing ends at /health that started at a known line
    assert parts == {"process_start": 8.0}
    assert startup_parts("", launch, launch + 5) == {}
    assert read_startup_parts(None, launch, launch + 5) == {}
    assert read_startup_parts(LOGS / "missing.log", launch, launch + 5) == {}


def test_a_stamp_rounded_down_before_the_launch_counts_as_no_time():
    launch = local("2026-12-02 04:26:30.7")  # SGLang's stamp of that second reads :30
    parts = startup_parts("[12-02 04:26:30] Starting server...\n", launch, launch + 1)
    assert parts["process_start"] == 0.0


def test_a_stamp_without_its_year_takes_the_year_of_the_launch_even_across_new_year():
    launch = local("2026-12-31 23:59:50")
    text = "[12-31 23:59:55] Starting server...\n[01-01 00:00:07] Loading pipeline modules...\n"
    parts = startup_parts(text, launch, local("2027-01-01 00:00:30"))
    assert parts == {"process_start": 5.0, "workers_start": 12.0}


def test_the_reference_servers_modelled_start_up_delay_is_a_part():
    # libero_eval.reference.server logs it when its delay ends (server.reference.startup_delay_s)
    text = "INFO: start-up delay: 40.0 s (server.reference.startup_delay_s)\n"
    assert startup_parts(text, 100.0, 141.0) == {"startup_delay": 40.0}


def test_sglang_lines_glued_to_a_progress_bar_are_still_read():
    text = (
        "Loading required modules:  75%|███ | 3/4 [00:04<00:01][12-03 14:18:00] Pipeline "
        "instantiated\n\x1b[32m[12-03 14:17:56] Loading pipeline modules...\x1b[0m\n"
    )
    launch = local("2026-12-03 14:17:50")
    parts = startup_parts(text, launch, launch + 20)
    assert parts["weights"] == 4.0


def test_the_denoise_graphs_a_pi05_server_captured_come_from_its_log():
    # a real π0.5 server on an H200: 5 graphs captured before the serve job's ready line
    # (the capacity probe), 11 after (docs/measurements/h200-2026-12-02/pi05_cuda_graphs.txt)
    sizes = denoise_graphs_captured(LOGS / "sglang_pi05_h200_graphs.log")
    assert sizes[:5] == [1, 9, 16, 6, 15]
    assert len(sizes) == 16 and sorted(sizes) == list(range(1, 17))
    assert denoise_graphs_captured(LOGS / "sglang_cosmos3_tiny_cpu.log") == []
    assert denoise_graphs_captured(None) == []
