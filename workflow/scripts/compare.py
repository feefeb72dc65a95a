"""Compare two runs episode by episode (paired by suite, task and init state)."""

import os
import sys

from libero_eval.compare import compare_runs
from libero_eval.report.comparison import write_comparison
from libero_eval.store import read_results

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    comparison = compare_runs(
        read_results([snakemake.input.baseline]),
        read_results([snakemake.input.candidate]),
        baseline_name=snakemake.wildcards.baseline,
        candidate_name=snakemake.wildcards.candidate,
        metric=snakemake.params.metric,
        confidence=snakemake.params.confidence,
        n_resamples=snakemake.params.resamples,
        seed=snakemake.params.seed,
    )
    for warning in comparison.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    write_comparison(comparison, dict(snakemake.output.items()))
