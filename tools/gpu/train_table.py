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
    print("| checkpoint | " + " | ".join(COLUMNS) + " | own (server launch -> aggregate) | ratio |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    for k in range(1, count + 1):
        name = f"checkpoint-{k}000"
        path = run / name / "summary" / "efficiency.csv"
        if not path.is_file():
            print(f"| {name} | no efficiency.csv |")
            continue
        row = pd.read_csv(path).iloc[0]
        own = float(row["aggregate_s"])  # from its origin, the server's launch
        cells = " | ".join(f"{float(row[c]):.1f}" if c in row else "" for c in COLUMNS)
        print(f"| {name} | {cells} | {own:.1f} | {own / float(row['bound_s']):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
