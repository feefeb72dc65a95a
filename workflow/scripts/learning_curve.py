"""A training run's learning curve, its paired tests and best checkpoint, from each
checkpoint's summary (libero_eval.report.learning_curve)."""

import os

from libero_eval.eventlog import log_event
from libero_eval.report.learning_curve import write_learning_curve

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    curve = write_learning_curve(
        run_id=snakemake.params.run_id,
        names=snakemake.params.names,
        summaries={key: list(paths) for key, paths in snakemake.input.items()},
        outputs=dict(snakemake.output.items()),
        metric=snakemake.params.metric,
        confidence=snakemake.params.confidence,
        decimals=snakemake.params.decimals,
        n_resamples=snakemake.params.resamples,
        seed=snakemake.params.seed,
    )
    log_event(
        snakemake.params.event_log,
        "learning curve",
        curve.best_line(snakemake.params.decimals) + f" ({snakemake.output.markdown})",
    )
