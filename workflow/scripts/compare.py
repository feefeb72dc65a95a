"""Compare two runs episode by episode (paired by suite, task and init state)."""

import os
import sys
from pathlib import Path

from libero_eval.analysis.comparable import SettingsDiffer, recorded_settings
from libero_eval.analysis.compare import compare_runs
from libero_eval.report.comparison import write_comparison
from libero_eval.store import read_results

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    inputs = [getattr(snakemake.input, role) for role in ("baseline", "candidate")]
    try:
        comparison = compare_runs(
            *(read_results([path]) for path in inputs),
            baseline_name=snakemake.wildcards.baseline,
            candidate_name=snakemake.wildcards.candidate,
            metric=snakemake.params.metric,
            confidence=snakemake.params.confidence,
            n_resamples=snakemake.params.resamples,
            seed=snakemake.params.seed,
            # results/<run>/summary/episodes.parquet -> what results/<run> recorded
            settings=tuple(recorded_settings(Path(path).parents[1]) for path in inputs),
            allow_different_settings=snakemake.params.allow_different_settings,
        )
    except SettingsDiffer as refused:
        print(f"compare: {refused}", file=sys.stderr)
        sys.exit(1)
    for warning in comparison.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    write_comparison(comparison, dict(snakemake.output.items()))
