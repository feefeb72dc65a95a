"""Write the report's efficiency page from the aggregate step's efficiency table."""

import os

from libero_eval.report.efficiency import write_efficiency_html

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    write_efficiency_html(
        snakemake.input.efficiency, snakemake.output.html, snakemake.params.event_log
    )
