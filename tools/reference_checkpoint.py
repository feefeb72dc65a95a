"""Reference-server "checkpoints" of different quality, to evaluate a training run on a CPU.

A reference-server checkpoint is a directory holding `reference_checkpoint.yaml`, whose keys
are `server.reference` fields (docs/training_runs.md). This writes one:

    .venv/bin/python tools/reference_checkpoint.py runs/ref/checkpoint-1000 --policy hold
    .venv/bin/python tools/reference_checkpoint.py runs/ref/checkpoint-2000 --slow 3
    .venv/bin/python tools/reference_checkpoint.py runs/ref/checkpoint-3000

`--slow K` makes a worse scripted expert: the checkpoint carries its own action statistics,
the package's Cosmos3 statistics with the translation channels' quantiles (q01, q99 of dx, dy,
dz, in `global` and `global_raw`) multiplied by K. The server normalizes its actions with
them and the client de-normalizes with the package's: (a - K q01) / (K (q99 - q01)) maps back
to a / K, so the arm moves K times slower and fewer episodes succeed within the step limit.
The rotation and gripper channels are unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STATS = REPO / "src/libero_eval/data/stats/libero_native_frame_wise_relative_rot6d.json"
TRANSLATION = (0, 1, 2)  # dx, dy, dz of the 10 Cosmos3 action channels


def slowed_stats(factor: float) -> dict:
    """The package's Cosmos3 statistics with the translation quantiles scaled by `factor`."""
    stats = json.loads(STATS.read_text())
    for block in ("global", "global_raw"):
        for key in ("q01", "q99"):
            values = stats[block][key]
            for channel in TRANSLATION:
                values[channel] = values[channel] * factor
    return stats


def write_reference_checkpoint(
    out: Path, policy: str = "scripted", slow: float | None = None, step: int | None = None
) -> Path:
    """A reference-server checkpoint directory at `out` (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    settings: dict = {"policy": policy}
    if slow is not None:
        (out / "action_stats.json").write_text(json.dumps(slowed_stats(slow), indent=1) + "\n")
        settings["action_stats_path"] = "action_stats.json"
    if step is not None:
        settings["step"] = step
    text = "# a reference-server checkpoint: server.reference fields (docs/training_runs.md)\n"
    (out / "reference_checkpoint.yaml").write_text(text + yaml.safe_dump(settings))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the checkpoint directory to write")
    parser.add_argument("--policy", choices=("hold", "scripted"), default="scripted")
    parser.add_argument("--slow", type=float, help="scripted: move K times slower (K > 1)")
    parser.add_argument("--step", type=int, help="its training step (else read from its name)")
    args = parser.parse_args(argv)
    if args.slow is not None and (args.policy != "scripted" or args.slow <= 0):
        parser.error("--slow K (K > 0) is for --policy scripted")
    print(write_reference_checkpoint(args.out, args.policy, args.slow, args.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
