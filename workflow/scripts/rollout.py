"""Run one shard of episodes against its slot's policy server."""

import os
from pathlib import Path

from libero_eval.plan import Episode
from libero_eval.rollout.shard_job import run_shard_job

# Env workers are spawned processes that re-import this file: only the parent runs the shard.
if __name__ == "__main__":
    snakemake = snakemake  # noqa: F821 - injected by Snakemake
    with open(snakemake.log[0], "a") as log:
        # fd-level redirect so env worker processes log here too
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        run_shard_job(
            config=snakemake.config,
            shard=snakemake.wildcards.shard,
            episodes=[Episode(*e) for e in snakemake.params.episodes],
            slot=snakemake.params.slot,
            output=Path(snakemake.output[0]),
            store_root=Path(snakemake.params.store),
            event_log=Path(snakemake.params.event_log),
            envs=snakemake.threads,
        )
