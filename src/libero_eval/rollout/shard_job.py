"""A rollout job as the workflow runs it: config → settings → wait for the server → shard.

The job process follows its parent: when Snakemake (or the Slurm job step) dies, even by
SIGKILL, the job gets SIGTERM (PR_SET_PDEATHSIG plus a parent-pid watchdog), stops its env
workers and exits; SIGTERM and Ctrl-C do the same. Finished episodes are in the store by then.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from libero_eval.eventlog import log_event
from libero_eval.faults import InjectedFault
from libero_eval.plan import Episode
from libero_eval.rollout.env_worker import EnvSettings
from libero_eval.rollout.render_device import RenderDeviceError, RenderPlan, plan_render_env
from libero_eval.rollout.runner import ClientSettings, ShardFailed, ShardSettings, run_shard
from libero_eval.service import ParentWatch, ServiceUnavailableError, wait_for_service
from libero_eval.settings import episode_protocol, server_settings
from libero_eval.store import EpisodeStore


class ShardTerminated(BaseException):
    """The job got SIGTERM (Snakemake, scancel, or its parent died)."""


def render_plan(config: dict[str, Any], slot: int) -> RenderPlan:
    """Where this slot's env workers render (`rollout.render_device`), as env variables."""
    rollout = config["rollout"]
    return plan_render_env(
        rollout.get("render_device", "auto"),
        mujoco_gl=rollout["mujoco_gl"],
        slot_gpu_ids=server_settings(config, slot)["gpu_id"],
        backend=config["server"]["backend"],
    )


def shard_settings(
    config: dict[str, Any],
    shard: str,
    slot: int,
    envs: int,
    event_log: Path | None,
    render: RenderPlan | None = None,
) -> ShardSettings:
    policy, rollout = config["policy"], config["rollout"]
    videos = rollout["videos"]
    run_id = config["run_id"]
    return ShardSettings(
        run_id=run_id,
        shard=shard,
        slot=slot,
        protocol=episode_protocol(config),
        env=EnvSettings(
            camera_size=rollout["camera_size"],
            render_mode=rollout["render_mode"],
            send_privileged_state=rollout["send_privileged_state"],
            reset_seeding=rollout["reset_seeding"],
            video_stride=videos["frame_stride"] if videos["enabled"] else 0,
            mujoco_gl=rollout["mujoco_gl"],
            render_env=dict(render.env) if render else {},
        ),
        policy_family=policy["family"],
        policy_settings=dict(policy),
        client=ClientSettings(
            timeout_s=policy["http_timeout_s"],
            max_retries=policy["http_max_retries"],
            retry_backoff_s=policy["http_retry_backoff_s"],
        ),
        envs_per_shard=max(1, envs),
        max_inflight_requests=rollout["max_inflight_requests"],
        batch_timeout_s=rollout["batch_timeout_s"],
        health_timeout_s=config["server"]["health_timeout_s"],
        event_log=event_log,
        video_dir=Path("results", run_id, "videos") if videos["enabled"] else None,
    )


def _follow_parent() -> ParentWatch:
    """SIGTERM ends the job with ShardTerminated; the parent's death sends SIGTERM."""

    received: list[int] = []

    def on_sigterm(signum: int, _frame: object) -> None:
        if not received:  # a second SIGTERM (death signal + watchdog) must not cut cleanup
            received.append(signum)
            raise ShardTerminated(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_sigterm)
    return ParentWatch(lambda _ppid: os.kill(os.getpid(), signal.SIGTERM)).start()


def run_shard_job(
    config: dict[str, Any],
    shard: str,
    episodes: list[Episode],
    slot: int,
    output: Path,
    store_root: Path,
    event_log: Path | None,
    envs: int,
) -> None:
    """Run the shard; on failure log why, keep finished episodes and exit non-zero."""
    try:
        render = render_plan(config, slot)  # before any env starts: a wrong device fails here
    except RenderDeviceError as exc:
        log_event(event_log, f"rollout {shard}", f"FAILED: {exc}")
        print(exc, file=sys.stderr)
        raise SystemExit(1) from exc
    log_event(event_log, f"rollout {shard}", f"env workers render on {render.description}")
    watch = _follow_parent()
    service_file = Path("results", config["run_id"], "servers", f"slot{slot}.json")
    settings = shard_settings(config, shard, slot, envs, event_log, render)
    store = EpisodeStore(store_root)
    url = ""
    resume = f"Finished episodes are kept in {store_root}; rerun the workflow to resume."
    try:
        if len(store.finished(episodes)) < len(episodes):
            serve_log = Path("logs", settings.run_id, "serve", f"slot{slot}.log")
            service = wait_for_service(
                service_file, timeout_s=settings.health_timeout_s, log_path=serve_log
            )
            url = service["url"]
        run_shard(episodes, settings, store, url, output)
    except (ShardFailed, ServiceUnavailableError, InjectedFault) as exc:
        log_event(event_log, f"rollout {shard}", f"FAILED: {exc}")
        print(f"{exc}\n{resume}", file=sys.stderr)
        raise SystemExit(1) from exc
    except (ShardTerminated, KeyboardInterrupt) as exc:
        reason = str(exc) or "interrupted (SIGINT)"
        log_event(event_log, f"rollout {shard}", f"STOPPED: {reason}")
        print(f"{shard} stopped: {reason}. {resume}", file=sys.stderr)
        raise SystemExit(143 if isinstance(exc, ShardTerminated) else 130) from None
    finally:
        watch.stop()
