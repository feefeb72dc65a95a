"""Aggregate shard results into per-task / per-suite / overall success tables, and each
slot's efficiency from the shards' dispatch logs."""

import json
import os

from libero_eval.analysis.aggregate import write_summary
from libero_eval.analysis.efficiency import write_efficiency

snakemake = snakemake  # noqa: F821 - injected by Snakemake
outputs = dict(snakemake.output.items())
# a checkpoint of a training run: what it ran with (libero_eval.checkpoints.checkpoint_record)
record_path = outputs.pop("checkpoint", None)
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    write_summary(
        shard_paths=snakemake.input.shards,
        plan_path=snakemake.input.plan,
        outputs=outputs,
        run_id=snakemake.params.run_id,
        confidence=snakemake.params.report["confidence_level"],
        decimals=snakemake.params.report["decimals"],
        event_log=snakemake.params.event_log,
        published=snakemake.params.report["published"],
        published_metric=snakemake.params.report["published_metric"],
        published_alpha=snakemake.params.report["published_alpha"],
        recorded_settings=snakemake.params.recorded_settings,
    )
    write_efficiency(
        dispatch_paths=snakemake.input.dispatch,
        service_files=snakemake.params.service_files,
        serve_logs=snakemake.params.serve_logs,
        csv_path=snakemake.output.efficiency,
        markdown_path=snakemake.output.markdown,
        event_log=snakemake.params.event_log,
    )
    if record_path is not None:
        with open(record_path, "w") as handle:
            json.dump(snakemake.params.checkpoint_record, handle, indent=2, sort_keys=True)
