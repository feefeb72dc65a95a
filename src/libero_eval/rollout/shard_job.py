"""A rollout job as the workflow runs it: start the envs while waiting for the server → run.

The job is composed above this layer (`libero_eval.config.RunSettings.rollout_job`, in the
job's process, once): its shard from plan.csv, where its env workers render, and the shard's
settings with the built policy adapter, and the fault plan of a fault-injection test
(`RolloutJob`); every path comes from its rule (`ShardPaths`). A fault plan is carried out
here, by wrapping the env workers, the policy connections and the episode store the shard
runs with (`fault_injection`). Its env workers start at once and come to their first
observation while the slot's server loads; the wait for the service file runs beside them
(`startup`), and a shard whose episodes are all finished needs no server. It follows its
parent: when Snakemake (or the Slurm job step) dies, even by SIGKILL, the job gets SIGTERM
(PR_SET_PDEATHSIG plus a parent-pid watchdog), stops its env workers and exits; SIGTERM and
SIGINT do the same, also while it waits for the server. Finished episodes are in the store by
then.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil

from libero_eval.eventlog import log_event
from libero_eval.faults import Faults, InjectedFault
from libero_eval.plan import Shard
from libero_eval.rollout.env_worker import EnvWorker
from libero_eval.rollout.fault_injection import (
    FaultyStore,
    faulty_connections,
    faulty_env_workers,
)
from libero_eval.rollout.render_device import RenderPlan
from libero_eval.rollout.shard_run import run_shard
from libero_eval.rollout.shard_settings import ShardFailed, ShardSettings
from libero_eval.rollout.startup import SERVER_RECORD, Service
from libero_eval.service import ParentWatch, ServiceUnavailableError, wait_for_service
from libero_eval.store import DiskFullError, EpisodeStore


class ShardTerminated(BaseException):
    """The job got SIGTERM or SIGINT (Snakemake, scancel, Ctrl-C, or its parent died)."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class ShardPaths:
    """Every file a rollout job reads or writes, as its rule names them."""

    plan: Path  # results/<run>/plan.csv: the shard's episodes and slot
    output: Path  # results/<run>/shards/<shard>.parquet
    store: Path  # results/<run>/episodes/<fingerprint>: one record per finished episode
    service_file: Path  # results/<run>/servers/slot<k>.json: the slot's server
    serve_log: Path  # logs/<run>/serve/slot<k>.log: quoted when the server is unavailable
    event_log: Path | None = None  # logs/<run>/eval_embodiment.log
    video_dir: Path | None = None  # results/<run>/videos (with rollout.videos.enabled)
    dispatch_log: Path | None = None  # results/<run>/shards/<shard>.dispatch.json


@dataclass(frozen=True)
class RolloutJob:
    """Everything a rollout job runs, derived once above this layer and handed down."""

    shard: Shard  # its episodes and slot, as plan.csv has them
    render: RenderPlan  # where its env workers render (`rollout.render_device`)
    settings: ShardSettings  # with the built policy adapter
    faults: Faults | None = None  # LIBERO_EVAL_FAULT's plan (fault-injection tests only)


def refuse_to_start(shard_name: str, event_log: Path | None, exc: Exception) -> NoReturn:
    """A job that cannot start (its render device, say): log why and exit 1."""
    log_event(event_log, f"rollout {shard_name}", f"FAILED: {exc}")
    print(exc, file=sys.stderr)
    raise SystemExit(1) from exc


def _follow_parent() -> ParentWatch:
    """SIGTERM or SIGINT ends the job with ShardTerminated, once; the parent's death (its
    shell, stopped with Snakemake: `libero_eval.interrupt`) sends SIGTERM."""

    received: list[int] = []

    def on_stop(signum: int, _frame: object) -> None:
        # a second signal (death signal + watchdog, or Ctrl-C's INT then the forwarded TERM)
        # must not cut the cleanup the first one started
        if not received:
            received.append(signum)
            raise ShardTerminated(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_stop)
    return ParentWatch(lambda _ppid: os.kill(os.getpid(), signal.SIGTERM)).start()


def run_shard_job(job: RolloutJob, paths: ShardPaths) -> None:
    """Run the shard; on failure log why, keep finished episodes and exit non-zero."""
    event_log, shard, shard_settings = paths.event_log, job.shard, job.settings
    shard_name = shard.name
    log_event(event_log, f"rollout {shard_name}", f"env workers render on {job.render.description}")
    watch = _follow_parent()
    store: EpisodeStore | FaultyStore = EpisodeStore(paths.store)
    env_workers = connections = None
    if job.faults is not None:  # carried out by wrappers; the runner knows nothing of it
        store = FaultyStore(store, job.faults, shard_name)
        env_workers = faulty_env_workers(
            lambda index: EnvWorker(index, shard_settings.env, shard_settings.protocol),
            job.faults,
        )
        connections = faulty_connections(job.faults)
    episodes = list(shard.episodes)
    resume = f"Finished episodes are kept in {paths.store}; rerun the workflow to resume."

    def service() -> Service:  # on the shard's server-wait thread
        info = wait_for_service(  # polled often: the first request leaves soon after ready
            paths.service_file,
            timeout_s=shard_settings.health_timeout_s,
            poll_s=0.2,
            log_path=paths.serve_log,
        )
        record = {key: info[key] for key in SERVER_RECORD if key in info}
        return info["url"], info.get("capacity"), record

    try:
        run_shard(
            episodes,
            shard_settings,
            store,
            None,
            paths.output,
            dispatch_log=paths.dispatch_log,
            env_workers=env_workers,
            connections=connections,
            wait_for_service=service,
            job_start=psutil.Process().create_time(),
        )
    except (ShardFailed, ServiceUnavailableError, InjectedFault, DiskFullError) as exc:
        log_event(event_log, f"rollout {shard_name}", f"FAILED: {exc}")
        print(f"{exc}\n{resume}", file=sys.stderr)
        raise SystemExit(1) from exc
    except (ShardTerminated, KeyboardInterrupt) as exc:
        reason = str(exc) or "interrupted (SIGINT)"
        log_event(event_log, f"rollout {shard_name}", f"STOPPED: {reason}")
        stopped = f"{shard_name} stopped (interrupted, not failed): {reason}."
        print(f"{stopped} {resume}", file=sys.stderr)
        raise SystemExit(getattr(exc, "exit_code", 130)) from None
    finally:
        watch.stop()
