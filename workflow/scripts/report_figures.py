"""Write the report's figures, tables, provenance or video page (whichever outputs the rule has)."""

import os

from libero_eval.report import write_report_outputs

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    write_report_outputs(
        episodes_path=snakemake.input.episodes,
        tables_path=snakemake.input.tables,
        outputs=dict(snakemake.output.items()),
        # a checkpoint's own config (checkpoints.smk), else the run's
        config=snakemake.params.get("config") or snakemake.config,
        repo_dir=snakemake.params.repo_dir,
        fingerprint=snakemake.params.fingerprint,
        action_stats=snakemake.params.get("action_stats"),
        checkpoint=snakemake.params.get("checkpoint"),
    )
