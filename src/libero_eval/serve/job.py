"""Run one policy server slot for a Snakemake `serve` job until asked to stop.

    exec python -m libero_eval.serve.job --settings '<json>' \\
        --service-file results/<run>/servers/slot<k>.json --event-log logs/<run>/eval_embodiment.log

The server's output goes to this process's stdout (the rule's log). The service file is
written atomically: status "starting" (with url, pid, pgid) once the server is spawned,
"ready" once GET /health answers 200, "failed" (with an error) or "stopped" at the end.
Consumers wait for it with `libero_eval.service.wait_for_service`.

With ``--capacity-probe '<json>'`` (`libero_eval.policy.capacity.CapacityProbe`, built above
this layer by `libero_eval.config.RunSettings.capacity_probe`) the job measures the healthy
server's own capacity before it announces it ready, and keeps the result in the service file
under "capacity" (through every later status) and as one line of the event log. A probe that
fails is a warning; the entry is then left out and the server still serves. Where the family
names them (`CapacityProbe.graph_batches`) the probe first sends each merged batch size once so
that the server captures its CUDA graphs before "ready"; the serve log tells it which it has.

The service file also says when the start's steps happened and how long its parts took
(docs/reporting.md, "Where the wall time went"): "timeline" (epoch seconds: ``launch`` the
server spawned, ``healthy`` its readiness path first 200, ``probe_done`` the probe finished,
null without one, ``ready`` "ready" published) and "startup_parts" (seconds: the server's own
start as its log tells it, `libero_eval.serve.startup`, plus ``cuda_graphs`` and ``probe``);
the event log gets one "server start" line with them.

Stops on SIGTERM (Snakemake, once every consumer finished), SIGINT, SIGHUP, or the death of
the parent process; then the server's whole process tree is torn down and the exit code is 0.
A server that fails to start or dies while serving gives exit code 1; bad settings give 2.

With ``server.backend: url`` nothing is started: the server is one the user runs, and the job
checks, probes and announces it the same way, then leaves it running
(`libero_eval.serve.url_server`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from libero_eval.policy.capacity import CapacityProbe
from libero_eval.serve.command import ServerHostError, build_command, resolve_port
from libero_eval.serve.events import EventLog, StopRequest, describe_capacity, now_iso, say
from libero_eval.serve.gpu_pool import HeldGpus, parse_pool, take_gpus
from libero_eval.serve.launcher import LaunchAborted, ManagedServer, ServerStartError
from libero_eval.serve.settings import ServerSettings, ServerSettingsError
from libero_eval.serve.startup import denoise_graphs_captured, describe_parts, read_startup_parts
from libero_eval.serve.url_server import UrlSlot
from libero_eval.service import ParentWatch, write_service_file

EXIT_STOPPED = 0
EXIT_SERVER_FAILED = 1
EXIT_BAD_SETTINGS = 2
TRACK_DESCENDANTS_EVERY_S = 5.0

#: (a server's URL, captured=() -> the graph batch sizes its log shows) -> its capacity entry
#: (`libero_eval.policy.capacity.CapacityProbe`)
Probe = Callable[..., dict[str, Any]]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m libero_eval.serve.job",
        description="Start a policy server slot, publish its service file, serve until SIGTERM.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--settings", help="server settings as a JSON object")
    source.add_argument("--settings-file", help="server settings as a JSON or YAML file")
    parser.add_argument("--service-file", required=True, help="where to publish url/pid/status")
    parser.add_argument("--event-log", help="milestone log to append to (eval_embodiment.log)")
    parser.add_argument(
        "--gpu-pool",
        help="take free GPUs from these ids (comma-separated), locked while serving "
        "(a run of several checkpoints, locally; libero_eval.serve.gpu_pool)",
    )
    parser.add_argument("--gpu-lock-dir", help="where the GPU pool's lock files are")
    parser.add_argument(
        "--capacity-probe",
        help="measure the server's capacity once healthy: a CapacityProbe as a JSON object",
    )
    return parser.parse_args(argv)


def load_probe(text: str | None) -> Probe | None:
    """The probe from --capacity-probe (None without it); ServerSettingsError when malformed."""
    if text is None:
        return None
    try:
        return CapacityProbe.from_dict(json.loads(text))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ServerSettingsError(f"--capacity-probe: {exc}") from exc


def _ranges(sizes: Sequence[int]) -> str:
    """``1-4, 6, 9-16`` (sorted, unique)."""
    runs: list[list[int]] = []
    for size in sorted(set(sizes)):
        if runs and size == runs[-1][-1] + 1:
            runs[-1].append(size)
        else:
            runs.append([size])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


def load_settings(args: argparse.Namespace) -> ServerSettings:
    """Settings from --settings (JSON text) or --settings-file (JSON or YAML)."""
    data: Any
    if args.settings is not None:
        try:
            data = json.loads(args.settings)
        except json.JSONDecodeError as exc:
            raise ServerSettingsError(f"--settings: not valid JSON ({exc})") from exc
    else:
        path = Path(args.settings_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ServerSettingsError(f"--settings-file {path}: cannot read ({exc})") from exc
        try:
            is_yaml = path.suffix in (".yaml", ".yml")
            data = yaml.safe_load(text) if is_yaml else json.loads(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ServerSettingsError(f"--settings-file {path}: cannot parse ({exc})") from exc
    return ServerSettings.from_dict(data)


def _install_signal_handlers(stop: StopRequest, watch: ParentWatch) -> None:
    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if watch.parent_gone():
            stop.request(f"parent process {watch.original_ppid} exited ({name})")
        else:
            stop.request(f"received {name}")

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)


class _Slot:
    """The state of one launch: settings, server, service file and event log."""

    def __init__(
        self,
        settings: ServerSettings,
        service_file: Path,
        events: EventLog,
        probe: Probe | None = None,
    ):
        self.settings = settings
        self.probe = probe
        self.server = ManagedServer(settings)
        self.service_file = service_file
        self.events = events
        self.info: dict[str, Any] = {
            "slot": settings.slot,
            "url": settings.base_url,
            "backend": settings.backend,
            "health_path": settings.health_path,
            "pid": None,
            "pgid": None,
            "launcher_pid": os.getpid(),
            "gpu_id": settings.gpu_id,  # the GPU(s) it is pinned to (None: the job's own)
            "started_at": now_iso(),
            "status": "starting",
            # epoch seconds of the start's steps (module doc); filled in as they happen
            "timeline": {"launch": None, "healthy": None, "probe_done": None, "ready": None},
        }

    def publish(self, status: str, **extra: Any) -> None:
        self.info.update(status=status, **extra)
        write_service_file(self.service_file, self.info)

    def fail(self, report: str, headline: str) -> int:
        say(report, error=True)
        self.server.stop()
        self.publish("failed", error=headline, stopped_at=now_iso())
        self.events.write(f"server failed: {headline}")
        return EXIT_SERVER_FAILED

    def measure(self) -> float | None:
        """Run the capacity probe against the healthy server; on success the entry joins the
        service file's content (published with "ready"), on failure a warning only. Returns
        the probe's seconds (None without a probe)."""
        if self.probe is None:
            return None
        started = time.monotonic()
        log_path = self.server.log_path
        try:
            capacity = self.probe(
                self.server.url, captured=lambda: denoise_graphs_captured(log_path)
            )
        except Exception as exc:  # noqa: BLE001 - a probe never fails the server
            message = f"capacity probe failed after {time.monotonic() - started:.1f} s: {exc!r}"
            say(f"warning: {message}", error=True)
            self.events.write(f"warning: {message}")
            return time.monotonic() - started
        self.info["capacity"] = capacity
        self.events.write(describe_capacity(capacity))
        return time.monotonic() - started

    def record_start(self, startup_s: float, probe_s: float | None) -> None:
        """The start's parts into the service file, and the event log's "server start" line:
        ``server start: 96.1 s to ready (80.2 s to healthy): process start 8.0 s, ...``."""
        timeline = self.info["timeline"]
        parts = read_startup_parts(self.server.log_path, timeline["launch"], timeline["healthy"])
        warmed = (self.info.get("capacity") or {}).get("graph_warmup") or {}
        if probe_s is not None:
            graphs = warmed.get("seconds")
            if graphs is not None:
                parts["cuda_graphs"] = round(graphs, 1)
            parts["probe"] = round(max(0.0, probe_s - (graphs or 0.0)), 1)
        self.info["startup_parts"] = parts
        total = (timeline["probe_done"] or timeline["healthy"]) - timeline["launch"]
        line = f"server start: {total:.1f} s to ready ({startup_s:.1f} s to healthy)"
        line += f": {describe_parts(parts)}" if parts else ""
        if warmed.get("captured") is not None:
            line += (
                f"; CUDA graphs of batch sizes {_ranges(warmed['captured'])} captured "
                f"before ready (asked for {_ranges(warmed['batches'])})"
            )
        self.events.write(line)

    def stopped(self, reason: str) -> int:
        say(f"stopping: {reason}")
        started = time.monotonic()
        self.server.stop()
        teardown_s = time.monotonic() - started
        self.publish("stopped", error=f"stopped: {reason}", stopped_at=now_iso())
        self.events.write(f"server stopped: {reason} (teardown {teardown_s:.1f} s)")
        return EXIT_STOPPED

    def run(self, stop: StopRequest) -> int:
        server, settings = self.server, self.settings
        self.events.write(f"server launch: {shlex.join(build_command(settings))}")
        timeline = self.info["timeline"]
        timeline["launch"] = time.time()
        try:
            server.start(sys.stdout)
        except ServerStartError as exc:
            return self.fail(str(exc), str(exc).splitlines()[0])
        self.publish("starting", pid=server.pid, pgid=server.pgid)
        threads = server.env.get("OMP_NUM_THREADS")
        say(
            f"slot {settings.slot}: started pid {server.pid} (OMP_NUM_THREADS={threads}), "
            f"waiting for {server.url}{settings.health_path}"
        )
        try:
            startup_s = server.wait_healthy(stop)
        except LaunchAborted:
            return self.stopped(stop.reason or "stop requested")
        except ServerStartError as exc:
            return self.fail(str(exc), f"{str(exc).splitlines()[0]} (see {server.log_path})")
        timeline["healthy"] = time.time()
        # before "ready": no consumer's request shares the server with it yet
        probe_s = self.measure()
        if probe_s is not None:
            timeline["probe_done"] = time.time()
        if stop.is_set():
            return self.stopped(stop.reason or "stop requested")
        self.record_start(startup_s, probe_s)
        # the event line first: whoever sees "ready" in the service file finds it in the log
        self.events.write(f"server ready: {server.url} ({startup_s:.1f} s)")
        timeline["ready"] = time.time()
        self.publish("ready", ready_at=now_iso(), startup_s=round(startup_s, 1))
        say(f"slot {settings.slot}: ready at {server.url} after {startup_s:.1f} s")
        last_tracked = time.monotonic()
        while not stop.wait(min(1.0, settings.health_poll_s)):
            code = server.poll()
            if code is not None:
                headline = (
                    f"{settings.backend} server (slot {settings.slot}) exited with code {code} "
                    f"while serving (see {server.log_path})"
                )
                return self.fail(server.failure_report(headline), headline)
            if time.monotonic() - last_tracked >= TRACK_DESCENDANTS_EVERY_S:
                server.track_descendants()
                last_tracked = time.monotonic()
        return self.stopped(stop.reason or "stop requested")


def _take_gpus(
    args: argparse.Namespace, settings: ServerSettings, stop: StopRequest, service_file: Path
) -> HeldGpus | None:
    """Free GPUs of --gpu-pool for this server (libero_eval.serve.gpu_pool); while it waits
    for them the service file says "waiting" (its shards keep waiting)."""
    pool = parse_pool(args.gpu_pool)
    count = settings.sglang.num_gpus if settings.sglang is not None else 1
    lock_dir = Path(args.gpu_lock_dir or service_file.parent)

    def waiting(message: str) -> None:
        say(message)
        write_service_file(
            service_file, {"slot": settings.slot, "status": "waiting", "note": message}
        )

    return take_gpus(pool, count, lock_dir, stop.wait, waiting)


def main(argv: Sequence[str] | None = None, probe: Probe | None = None) -> int:
    """Launch one server slot; returns the process exit code. ``probe`` (else the one
    --capacity-probe describes) measures the server once it is healthy."""
    args = _parse_args(argv)
    try:
        settings = load_settings(args)
        probe = probe or load_probe(args.capacity_probe)
    except ServerSettingsError as exc:
        say(str(exc), error=True)
        return EXIT_BAD_SETTINGS

    stop = StopRequest()
    watch = ParentWatch(lambda ppid: stop.request(f"parent process {ppid} exited"))
    _install_signal_handlers(stop, watch)  # before PR_SET_PDEATHSIG can deliver SIGTERM
    watch.start()

    events = EventLog(args.event_log, settings.slot)
    service_file = Path(args.service_file)
    with contextlib.suppress(FileNotFoundError):
        service_file.unlink()  # never let consumers see a previous run's file
    if settings.backend == "url":  # a server the user runs: checked, never started or stopped
        try:
            return UrlSlot(settings, service_file, events, probe).run(stop)
        finally:
            watch.stop()
    held = None
    if args.gpu_pool:  # kept (and its locks held) until the process exits
        try:
            held = _take_gpus(args, settings, stop, service_file)
        except ValueError as exc:
            say(str(exc), error=True)
            return EXIT_BAD_SETTINGS
        if held is None:
            watch.stop()
            return EXIT_STOPPED
        settings = dataclasses.replace(settings, gpu_id=held.pin)
        events.write(f"server takes GPU {held.pin} of the pool {args.gpu_pool}")
    try:
        slot = _Slot(resolve_port(settings), service_file, events, probe)
    except ServerHostError as exc:  # no server started: the service file tells the shards
        watch.stop()
        return _Slot(settings, service_file, events).fail(str(exc), str(exc))
    try:
        return slot.run(stop)
    finally:
        slot.server.stop()
        watch.stop()


if __name__ == "__main__":
    sys.exit(main())
