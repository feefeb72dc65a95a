"""Each checkpoint's timeline in a training run that tools/gpu/run_h200.sh's train-* phase ran:

    python3 tools/gpu/train_table.py RUN_DIR COUNT

RUN_DIR holds checkpoint-1000 .. checkpoint-<COUNT>000, each with the checkpoint's
``summary/efficiency.csv`` (the report's windows, libero_eval.analysis.timeline, whose origin
for a checkpoint is its server's launch: before it, its server waited for the GPU while the
checkpoints before it ran). A checkpoint's own time is its server's launch to its aggregate;
its bound is the report's: its server's start to ready plus its observations at the probe's
closed-loop rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from libero_eval.analysis.display import markdown_table

# efficiency.csv's windows and bound
COLUMNS = (
    "start_to_ready_s",
    "envs_ready_s",
    "ready_to_first_request_s",
    "serving_s",
    "last_answer_to_shard_end_s",
    "shard_end_to_aggregate_s",
    "observations",
    "bound_s",
)


def main(run: Path, count: int) -> int:
    rows = []
    for k in range(1, count + 1):
        name = f"checkpoint-{k}000"
        path = run / name / "summary" / "efficiency.csv"
        if not path.is_file():
            print(f"{name}: no {path}")
            continue
        row = pd.read_csv(path).iloc[0]
        own = float(row["aggregate_s"])  # from its origin, the server's launch
        rows.append(
            {"checkpoint": name, **row.reindex(list(COLUMNS)).round(1).to_dict()}
            | {"server launch -> aggregate": round(own, 1), "ratio": round(own / row["bound_s"], 2)}
        )
    if rows:
        print(markdown_table(pd.DataFrame(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
