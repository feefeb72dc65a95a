"""A TERM or INT sent to the workflow's process (Snakemake) alone stops its running jobs now.

Snakemake 9.27 lets running jobs run on when told to stop: on SIGTERM it "will exit after
finishing currently running jobs" (`JobScheduler.exit_gracefully`,
snakemake/scheduling/job_scheduler.py), and on SIGINT it catches the KeyboardInterrupt and
calls the local executor's `cancel`, a `ThreadPoolExecutor.shutdown` that waits for the job
threads, each waiting for its job's process (snakemake/executors/local.py). The jobs are child
processes in Snakemake's process group, so only a terminal's Ctrl-C, which signals the whole
group, reached them; a `kill`, a batch system or a parent script signalling Snakemake alone
left every rollout shard to run its remaining episodes, and the run then said a job failed.

:class:`StopJobsOnSignal`, installed in the Snakemake process by the workflow's ``onstart``
(local execution only), passes the stop on: at SIGTERM or SIGINT it sends SIGTERM to each of
Snakemake's child processes (a job's shell, or the job itself where the shell exec'd it), then
hands the signal to the handler it replaced (Snakemake's), which stops scheduling and waits
for them. A rollout job stops when its shell dies (parent-death signal and watch,
`rollout.shard_job`), keeping its finished episodes; a serve job tears its server down. The
workflow's ``onerror`` then says the run was interrupted (:meth:`StopJobsOnSignal.explain`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any, Self

import psutil

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_children(signum: int = signal.SIGTERM) -> list[int]:
    """Send `signum` to this process's children (not their descendants: each job stops its
    own); the pids signalled."""
    stopped = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)
            stopped.append(child.pid)
    return stopped


class StopJobsOnSignal:
    """At SIGTERM or SIGINT: SIGTERM to every child process, then the replaced handler."""

    def __init__(self, stop: Callable[[], list[int]] = stop_children):
        self.received: str | None = None  # the first stop signal's name
        self._stop = stop
        self._previous: dict[int, Any] = {}

    def install(self) -> Self:
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        stopped = self._stop()
        if self.received is None:
            self.received = name
            # os.write, not print: a handler may run while the main thread is printing
            os.write(
                2,
                f"\n{name}: stopping the {len(stopped)} running job(s) now; rollout shards keep "
                "their finished episodes, and rerunning the same command resumes.\n".encode(),
            )
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def explain(self, store: str) -> str | None:
        """What to say when the run ends unfinished: None unless a stop signal came; the
        finished episodes are in `store`."""
        if self.received is None:
            return None
        return (
            f"Interrupted by {self.received}, not failed: the running jobs were stopped (their "
            f"errors above are that stop). Finished episodes are kept in {store}; run the same "
            "command again to resume from them."
        )
