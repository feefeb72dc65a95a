"""Compare each perturbation suite of the run with its clean suite (paired where possible)."""

import os

from libero_eval.analysis.robustness import robustness
from libero_eval.report.robustness import write_robustness
from libero_eval.store import read_results

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    result = robustness(
        read_results([snakemake.input.episodes]),
        metric=snakemake.params.metric,
        confidence=snakemake.params.confidence,
        n_resamples=snakemake.params.resamples,
        seed=snakemake.params.seed,
    )
    write_robustness(result, dict(snakemake.output.items()))
