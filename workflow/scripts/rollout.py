"""Run one shard of episodes against its slot's policy server."""

import os
from pathlib import Path

from libero_eval.checkpoint_identity import Checkpoint
from libero_eval.config import RunSettings
from libero_eval.rollout.render_device import RenderDeviceError
from libero_eval.rollout.shard_job import ShardPaths, refuse_to_start, run_shard_job
from libero_eval.service import ServiceUnavailableError

# Env workers are spawned processes that re-import this file: only the parent runs the shard.
if __name__ == "__main__":
    snakemake = snakemake  # noqa: F821 - injected by Snakemake
    with open(snakemake.log[0], "a") as log:
        # fd-level redirect so env worker processes log here too
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        paths = ShardPaths(
            plan=Path(snakemake.input.plan),
            output=Path(snakemake.output[0]),
            store=Path(snakemake.params.store),
            service_file=Path(snakemake.params.service_file),
            serve_log=Path(snakemake.params.serve_log),
            event_log=Path(snakemake.params.event_log),
            video_dir=Path(snakemake.params.video_dir),
            dispatch_log=Path(snakemake.output.dispatch),
        )
        shard_name = snakemake.wildcards.shard
        settings = RunSettings(snakemake.config)
        checkpoint = snakemake.params.get("checkpoint")  # a checkpoint of a training run
        if checkpoint is not None:
            settings = settings.for_checkpoint(Checkpoint.from_dict(checkpoint))
        try:  # the job composed once, above the rollout layer: render plan, settings, adapter
            job = settings.rollout_job(
                shard_name,
                # the rule's threads: rollout.envs_per_shard, lowered by Snakemake to --cores
                snakemake.threads,
                paths,
            )
        except (RenderDeviceError, ServiceUnavailableError) as exc:  # before any env starts
            refuse_to_start(shard_name, paths.event_log, exc)
        run_shard_job(job, paths)
