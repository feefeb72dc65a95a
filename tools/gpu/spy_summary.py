"""Where a server's main thread spent its time, from py-spy's raw (collapsed) profiles:
    python tools/gpu/spy_summary.py PROFILE.txt...      (run_h200.sh's PYSPY writes them)

For each profile, the share of the main thread's samples by what it was doing: waiting for the
GPU (a `torch.cuda.synchronize` frame at the top of its stack) or running Python, by the
pipeline stage or the scheduler method it was in, and where it waited from.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

MAIN_THREAD = "<module>"  # py-spy's first frame of a process's main thread
STAGE_CALL = "PipelineExecutor.run_stage_with_context"


def _name(frame: str) -> str:
    return frame.split(" (")[0]


def where(frames: list[str]) -> str:
    """The pipeline stage a stack is in (after SGLang's stage call), else its innermost
    scheduler or GPU worker method."""
    for i, frame in enumerate(frames):
        if frame.startswith(STAGE_CALL):
            for inner in frames[i + 1 :]:
                if "Stage" in inner and ("forward" in inner or "__call__" in inner):
                    return _name(inner)
    for frame in reversed(frames):
        if frame.startswith(("Scheduler.", "GPUWorker.")):
            return _name(frame)
    return "other"


def summarize(path: Path) -> str:
    """The lines of one profile's summary."""
    shares: Counter[tuple[str, str]] = Counter()
    waits: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not line or not frames[0].startswith(MAIN_THREAD):
            continue
        total += int(count)
        waiting = frames[-1].startswith("synchronize")
        shares[("GPU wait" if waiting else "Python", where(frames))] += int(count)
        if waiting and len(frames) > 2:
            waits[f"{_name(frames[-2])} <- {_name(frames[-3])}"] += int(count)
    lines = [f"{path.name}: {total} samples of the main thread"]
    lines += [f"  {n / total:6.1%}  {kind:8s}  {at}" for (kind, at), n in shares.most_common(8)]
    lines += [f"  waits from {n / total:6.1%}  {at}" for at, n in waits.most_common(3)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+", type=Path)
    for path in parser.parse_args().profiles:
        print(summarize(path))


if __name__ == "__main__":
    main()
