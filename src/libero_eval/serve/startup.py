"""A policy server's start, part by part, from its own log (the slot's serve log).

The serve job knows two instants itself: when it spawned the server (``launch``) and when
``/health`` first answered 200 (``healthy``). Between them the server's log says where the time
went, in lines whose text and timestamp SGLang 0.5.23 writes (each cited below, under
``sglang/multimodal_gen/``). A part is the time from one such line to the next; the parts are:

- ``process_start``: launch to "Starting server..." (`runtime/launch_server.py`
  ``launch_server``): the ``sglang`` command's imports and its argument parsing;
- ``workers_start``: to "Loading pipeline modules..." (`runtime/pipelines_core/
  composed_pipeline_base.py` ``ComposedPipelineBase.__init__``): the scheduler's worker
  process spawned, its imports, the device and torch.distributed set up;
- ``weights``: to "Pipeline instantiated" (`runtime/pipelines_core/__init__.py`
  ``build_pipeline``): the model's modules and weights loaded (as the model's own loader
  logs them: one line per component, or one for a policy model) and the pipeline's stages
  built;
- ``http_start``: to uvicorn's "Uvicorn running on ..." (`runtime/launch_server.py`
  ``launch_http_server_only``): the scheduler loop started, the HTTP server up;
- ``warmup``: to "The server is fired up and ready to roll!" (`runtime/entrypoints/
  http_server.py` ``_run_server_warmup_after_http_live``): SGLang's own synthetic warm-up
  request, run where its ``warmup_mode`` is "server" and the task is visual generation
  (`runtime/warmup_request_builder.py` ``supports_synthetic_warmup``; at the request shape a
  family gives, ``Family.sglang_warmup``, else SGLang's default). A VLA action pipeline
  (``VLA_ACTION``) has none: the part is absent;
- ``health``: from the last of those lines to ``healthy`` (SGLang's ``/health`` turns 200 once
  its warm-up is done; plus the serve job's poll interval).

A part is present only when both of its ends are known: a line that is missing (another server,
another SGLang version) leaves out the parts on either side of it, never guessed. SGLang stamps
its lines to the second (`runtime/utils/logging_utils.py` ``configure_logger``: ``[%m-%d
%H:%M:%S]``; its uvicorn lines ``[%Y-%m-%d %H:%M:%S]``, ``set_uvicorn_logging_configs``), in
local time, so a part is known to about a second. The reference server (`libero_eval.reference.
server`, `server.reference.startup_delay_s`) logs "start-up delay: <s> s" when its modelled
slow start ends: that gives ``startup_delay``.

The serve job adds what it measures itself: ``cuda_graphs`` (the capacity probe's graph
warm-up, `libero_eval.policy.capacity`) and ``probe``. The CUDA graphs SGLang's VLA pipeline
captured (``Captured VLA denoise CUDA graph: batch=N ...``, `runtime/vla/cuda_graph.py`
``VLADenoiseGraphRunner._capture``) are read by :func:`denoise_graphs_captured`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# one of SGLang's stamps, and the message up to the next one (a tqdm bar may share the line)
STAMP = re.compile(r"\[(?:(?P<year>\d{4})-)?(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)[^\]\n]*\] ")

# (the part that ends at the line, the line), in the order SGLang writes them
SGLANG_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("process_start", re.compile(r"^Starting server\.\.\.")),
    ("workers_start", re.compile(r"^Loading pipeline modules\.\.\.")),
    ("weights", re.compile(r"^Pipeline instantiated")),
    ("http_start", re.compile(r"^INFO:\s+Uvicorn running on ")),
    ("warmup", re.compile(r"^The server is fired up and ready to roll!")),
)
HEALTH_PART = "health"
# the reference server's modelled slow start (libero_eval.reference.server load_policy)
REFERENCE_DELAY = re.compile(r"start-up delay: (\d+(?:\.\d+)?) s")
# SGLang's VLA denoise graph captures (runtime/vla/cuda_graph.py VLADenoiseGraphRunner._capture)
DENOISE_CAPTURED = re.compile(r"Captured VLA denoise CUDA graph: batch=(\d+) prefix=(\d+)")
# the serve job's line once its server is ready (libero_eval.serve.job)
SERVE_JOB_READY = re.compile(r"\[libero_eval\.serve\.job\] slot \d+: ready at ")

#: how each part reads in a log line, in order
PART_NAMES = {
    "process_start": "process start",
    "workers_start": "workers",
    "weights": "weights",
    "http_start": "HTTP server",
    "warmup": "SGLang warm-up",
    "health": "until /health",
    "startup_delay": "start-up delay",
    "cuda_graphs": "CUDA graphs",
    "probe": "capacity probe",
}


def stamped_messages(text: str, near: float) -> Iterator[tuple[float, str]]:
    """(epoch seconds, message) of every stamped message in a server's log text; a stamp
    without a year takes the year that puts it nearest to ``near`` (epoch seconds)."""
    for line in ANSI.sub("", text).splitlines():
        stamps = list(STAMP.finditer(line))
        for i, match in enumerate(stamps):
            end = stamps[i + 1].start() if i + 1 < len(stamps) else len(line)
            message = line[match.end() : end].strip()
            yield _epoch(match, near), message


def _epoch(match: re.Match[str], near: float) -> float:
    """A stamp's local time as epoch seconds (the server logs in the serve job's time zone)."""
    month_day, hms = match["md"], match["hms"]
    if match["year"]:
        years = [int(match["year"])]
    else:
        year = datetime.fromtimestamp(near).year
        years = [year - 1, year, year + 1]  # a run across New Year
    candidates = []
    for year in years:
        try:
            stamp = datetime.strptime(f"{year}-{month_day} {hms}", "%Y-%m-%d %H:%M:%S")
        except ValueError:  # 02-29 of a year without it
            continue
        candidates.append(time.mktime(stamp.timetuple()))
    return min(candidates, key=lambda t: abs(t - near)) if candidates else float("nan")


def startup_parts(text: str, launch: float, healthy: float) -> dict[str, float]:
    """The server's start in parts (module doc), seconds rounded to 0.1, from its log text
    and the serve job's ``launch`` and ``healthy`` (epoch seconds). Parts whose ends are not
    both in the log are absent."""
    found: dict[str, float] = {}
    delay = None
    for at, message in stamped_messages(text, launch):
        for part, pattern in SGLANG_MARKS:
            if part not in found and pattern.search(message):
                found[part] = at
        if delay is None and (match := REFERENCE_DELAY.search(message)):
            delay = float(match.group(1))
    if delay is None:  # the reference server's lines need not carry SGLang's stamps
        match = REFERENCE_DELAY.search(ANSI.sub("", text))
        delay = float(match.group(1)) if match else None
    parts: dict[str, float] = {}
    previous: tuple[str, float] | None = ("launch", launch)
    for part, _ in SGLANG_MARKS:
        at = found.get(part)
        if at is None:
            # an absent line: no part ends here, and the next starts at an unknown time,
            # except after a warm-up SGLang did not run (the last part then ends at /health)
            if part != "warmup":
                previous = None
            continue
        if previous is not None:
            # a second-resolution stamp may fall just before the launch, or a part's start
            parts[part] = _seconds(at - max(previous[1], launch))
        previous = (part, max(at, previous[1]) if previous else at)
    if previous is not None and previous[0] != "launch":
        parts[HEALTH_PART] = _seconds(healthy - min(previous[1], healthy))
    if delay is not None:
        parts["startup_delay"] = delay
    return parts


def _seconds(value: float) -> float:
    return round(max(0.0, value), 1)


def read_startup_parts(log_path: str | Path | None, launch: float, healthy: float) -> dict:
    """:func:`startup_parts` of the log file at ``log_path`` ({} without a readable log)."""
    text = _read(log_path)
    return startup_parts(text, launch, healthy) if text else {}


def denoise_graphs_captured(log_path: str | Path | None) -> list[int]:
    """The batch sizes of the VLA denoise CUDA graphs the server captured so far, in the
    order of its log (one entry per capture; [] without a log or such lines)."""
    return [int(m.group(1)) for m in DENOISE_CAPTURED.finditer(_read(log_path))]


def describe_parts(parts: dict[str, float]) -> str:
    """``process start 41.6 s, workers 33.0 s, ...`` in :data:`PART_NAMES`' order."""
    return ", ".join(
        f"{name} {parts[key]:.1f} s" for key, name in PART_NAMES.items() if key in parts
    )


def _read(log_path: str | Path | None) -> str:
    if log_path is None:
        return ""
    try:
        return Path(log_path).read_text(errors="replace")
    except OSError:
        return ""
