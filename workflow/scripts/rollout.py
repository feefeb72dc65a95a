"""Run one shard of episodes against its slot's policy server."""

import os
from pathlib import Path

from libero_eval.config import RunSettings
from libero_eval.rollout.shard_job import ShardPaths, run_shard_job

# Env workers are spawned processes that re-import this file: only the parent runs the shard.
if __name__ == "__main__":
    snakemake = snakemake  # noqa: F821 - injected by Snakemake
    with open(snakemake.log[0], "a") as log:
        # fd-level redirect so env worker processes log here too
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        run_shard_job(
            settings=RunSettings(snakemake.config),
            shard_name=snakemake.wildcards.shard,
            # the rule's threads: rollout.envs_per_shard, lowered by Snakemake to --cores
            envs_per_shard=snakemake.threads,
            paths=ShardPaths(
                plan=Path(snakemake.input.plan),
                output=Path(snakemake.output[0]),
                store=Path(snakemake.params.store),
                service_file=Path(snakemake.params.service_file),
                serve_log=Path(snakemake.params.serve_log),
                event_log=Path(snakemake.params.event_log),
                video_dir=Path(snakemake.params.video_dir),
            ),
        )
