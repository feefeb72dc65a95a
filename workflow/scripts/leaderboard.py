"""Write the leaderboard of every run under results/ (`libero_eval.report.leaderboard`)."""

import os
from pathlib import Path

from libero_eval.report.leaderboard import write_leaderboard

snakemake = snakemake  # noqa: F821 - injected by Snakemake
with open(snakemake.log[0], "w") as log:
    os.dup2(log.fileno(), 2)
    paths = write_leaderboard(["results"], Path(snakemake.output.markdown).parent)
    print(f"wrote {', '.join(map(str, paths.values()))}", file=log)
