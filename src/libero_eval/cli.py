"""`libero-eval`: look at runs from the shell.

libero-eval status results/<run>            one line, also while the evaluation runs
libero-eval compare <baseline> <candidate>  paired comparison of two finished runs
libero-eval leaderboard [results/ | runs...] one row per run: Markdown, CSV and an HTML page
libero-eval watch DIR --configfile my.yaml  evaluate a training run's checkpoints as they appear
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from libero_eval import settings_schema
from libero_eval.eventlog import last_invocation_start
from libero_eval.plan import Episode, episodes_from_table
from libero_eval.store import EpisodeStore


def run_dir_of(run: str | Path, results_dir: str | Path = "results") -> Path:
    """`run` as given if it is a path (a directory or has a '/'), else `<results_dir>/<run>`."""
    path = Path(run)
    return path if path.is_dir() or len(path.parts) > 1 else Path(results_dir) / path


@dataclass(frozen=True)
class RunStatus:
    """Progress of one run, read from its plan and its episode store."""

    run_id: str
    planned: int
    done: int
    successes: int
    errors: int
    elapsed_s: float | None
    eta_s: float | None
    fingerprint: str | None
    # what elapsed_s counts from: "invocation" (the latest workflow invocation's start, in
    # the event log) or "first episode" (no such line: the oldest record's start)
    since: str = "invocation"
    done_since: int = 0  # episodes finished since then: the rate behind the ETA

    def line(self) -> str:
        def pct(part: int, whole: int) -> str:
            return f"{100 * part / whole:.1f}%" if whole else "n/a"

        def clock(seconds: float | None) -> str:
            return "-" if seconds is None else str(datetime.timedelta(seconds=round(seconds)))

        eta = "done" if self.done == self.planned and self.planned else clock(self.eta_s)
        elapsed = clock(self.elapsed_s)
        if self.elapsed_s is not None and self.since == "invocation":
            elapsed += f" this invocation ({self.done_since} episodes in it)"
        elif self.elapsed_s is not None:
            elapsed += " since the first episode"
        return (
            f"{self.run_id}: {self.done}/{self.planned} episodes ({pct(self.done, self.planned)}), "
            f"success_once {self.successes}/{self.done} ({pct(self.successes, self.done)}), "
            f"errors {self.errors}, elapsed {elapsed}, ETA {eta}"
        )


def _planned_episodes(run_dir: Path) -> list[Episode]:
    plan_path = run_dir / "plan.csv"
    if not plan_path.is_file():
        raise FileNotFoundError(
            f"{plan_path} does not exist: {run_dir} is not a started run (the workflow's plan "
            "step writes it first). Pass results/<run_id> of a run that has started."
        )
    plan = pd.read_csv(plan_path)
    missing = {"suite", "task_id", "init_state_id"} - set(plan.columns)
    if missing:
        raise ValueError(f"{plan_path}: missing columns {sorted(missing)}; rerun the plan step")
    return episodes_from_table(plan)


def _newest_store(run_dir: Path, episodes: list[Episode]) -> EpisodeStore | None:
    """The fingerprint directory whose planned-episode records changed last (the live one)."""
    newest: tuple[float, EpisodeStore] | None = None
    for root in sorted((run_dir / "episodes").glob("*/")):
        store = EpisodeStore(root)
        mtimes = [path.stat().st_mtime for path in map(store.path_for, episodes) if path.is_file()]
        if mtimes and (newest is None or max(mtimes) > newest[0]):
            newest = (max(mtimes), store)
    return newest[1] if newest else None


def event_log_of(run_dir: Path) -> Path:
    """`logs/<run>/eval_embodiment.log` beside `results/<run>` (both under the workflow's
    working directory)."""
    return run_dir.resolve().parent.parent / "logs" / run_dir.name / "eval_embodiment.log"


def run_status(
    run: str | Path, now: float | None = None, event_log: str | Path | None = None
) -> RunStatus:
    """Progress of `run` (results/<run_id> or its id), read while the evaluation may run.

    Elapsed time and ETA count from the start of the latest workflow invocation (its line in
    `event_log`, by default `event_log_of(run_dir)`) and the episodes finished since: a rerun
    that resumes is timed on its own, not from the run's first episode ever. Without that line
    they count from the oldest record's start."""
    run_dir = run_dir_of(run)
    episodes = _planned_episodes(run_dir)
    store = _newest_store(run_dir, episodes)
    records = [r for r in map(store.load, episodes) if r is not None] if store else []
    now = time.time() if now is None else now
    invocation = last_invocation_start(event_log or event_log_of(run_dir))
    elapsed = eta = None
    since = "invocation" if invocation is not None else "first episode"
    if invocation is None and records:
        invocation = min(r["finished_at"] - r["wall_time_s"] for r in records)
    recent = [r for r in records if invocation is not None and r["finished_at"] >= invocation]
    remaining = len(episodes) - len(records)
    if invocation is not None and (recent or remaining):
        if remaining:
            elapsed = max(now - invocation, 0.0)
        else:  # finished: the time the invocation took, not the time since it started
            elapsed = max(r["finished_at"] for r in recent) - invocation
        eta = elapsed / len(recent) * remaining if recent else None
    return RunStatus(
        run_id=run_dir.name,
        planned=len(episodes),
        done=len(records),
        successes=sum(bool(r["success_once"]) for r in records),
        errors=sum(r.get("error") is not None for r in records),
        elapsed_s=elapsed,
        eta_s=eta,
        fingerprint=store.root.name if store else None,
        since=since,
        done_since=len(recent),
    )


def _status(args: argparse.Namespace) -> int:
    status = run_status(args.run)
    if args.json:
        print(json.dumps(status.__dict__))
    else:
        print(status.line())
    return 0


def _compare(args: argparse.Namespace) -> int:
    from libero_eval.analysis.comparable import recorded_settings
    from libero_eval.analysis.compare import compare_runs, comparison_markdown, load_episodes

    baseline_dir = run_dir_of(args.baseline, args.results_dir)
    candidate_dir = run_dir_of(args.candidate, args.results_dir)
    comparison = compare_runs(
        load_episodes(baseline_dir),
        load_episodes(candidate_dir),
        baseline_name=baseline_dir.name,
        candidate_name=candidate_dir.name,
        metric=args.metric,
        confidence=args.confidence,
        n_resamples=args.resamples,
        seed=args.seed,
        settings=(recorded_settings(baseline_dir), recorded_settings(candidate_dir)),
        allow_different_settings=args.allow_different_settings,
    )
    if args.output_dir:
        from libero_eval.report.comparison import write_comparison

        out = Path(args.output_dir)
        write_comparison(
            comparison,
            {
                "markdown": out / "comparison.md",
                "html": out / "comparison.html",
                "per_task": out / "per_task.csv",
                "flipped": out / "flipped.csv",
                "unmatched": out / "unmatched.csv",
                "figure": out / "difference.png",
            },
        )
    for warning in comparison.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    print(comparison_markdown(comparison), end="")
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    from libero_eval.report.leaderboard import write_leaderboard

    paths = write_leaderboard(args.sources, args.out, compute_pairs=args.paired)
    print(paths["md"].read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def _watch(args: argparse.Namespace) -> int:
    from libero_eval.watch import Watcher, snakemake_runner, watch

    directory = Path(args.directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory (the training run's output)")
    for path in args.configfile:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--configfile {path}: no such file")
    watcher = Watcher(
        directory,
        snakemake_runner(args.configfile, args.cores, args.snakemake_args),
        pattern=args.pattern,
        stable_s=args.stable_s,
        marker=args.marker,
        say=lambda line: print(line, flush=True),
    )
    print(
        f"[watch] {directory / args.pattern}: a checkpoint is evaluated once "
        + (f"it has {args.marker} and " if args.marker else "")
        + f"its files are {args.stable_s:g} s old; looking every {args.poll_s:g} s",
        flush=True,
    )
    try:
        return watch(watcher, args.poll_s, once=args.once)
    except KeyboardInterrupt:
        print("[watch] stopped", file=sys.stderr)
        return 130


def config_value(*path: str) -> Callable[[str], Any]:
    """An argparse ``type`` for a flag that stands for the config field at ``path``: the text
    read as a config's YAML would give it, checked against the field's subschema (the error
    names the field and what is wrong, in the schema's words)."""
    *parent, name = path
    spec = settings_schema.section(*parent)["properties"][name]

    def parse(text: str) -> Any:
        value = yaml.safe_load(text)
        problems = settings_schema.messages(value, spec, ".".join(path), fill=False)
        if problems:
            raise argparse.ArgumentTypeError("; ".join(problems))
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="libero-eval", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    status = commands.add_parser(
        "status", help="one-line progress of a run (reads its plan and episode store)"
    )
    status.add_argument("run", help="results/<run_id> (or the run id)")
    status.add_argument("--json", action="store_true", help="print the fields as JSON")
    status.set_defaults(handler=_status)

    compare = commands.add_parser(
        "compare", help="paired comparison of two aggregated runs (prints Markdown)"
    )
    compare.add_argument("baseline", help="run id or results/<run_id> of the baseline")
    compare.add_argument("candidate", help="run id or results/<run_id> of the candidate")
    # these flags are config fields (compare.*, report.confidence_level), which the workflow's
    # compare rule reads: their defaults, choices and checks are the schema's, so one command
    # line or the other gives the same result
    compare.add_argument(
        "--metric",
        type=config_value("compare", "metric"),
        choices=settings_schema.choices("compare")["metric"],
        default=settings_schema.default("compare", "metric"),
        help="per-episode outcome compared (default %(default)s, compare.metric)",
    )
    compare.add_argument(
        "--confidence",
        type=config_value("report", "confidence_level"),
        default=settings_schema.default("report", "confidence_level"),
        help="confidence level (default %(default)s, report.confidence_level)",
    )
    compare.add_argument(
        "--resamples",
        type=config_value("compare", "bootstrap_resamples"),
        default=settings_schema.default("compare", "bootstrap_resamples"),
        help="bootstrap resamples (default %(default)s, compare.bootstrap_resamples)",
    )
    compare.add_argument(
        "--seed",
        type=config_value("compare", "seed"),
        default=settings_schema.default("compare", "seed"),
        help="bootstrap seed (default %(default)s, compare.seed)",
    )
    compare.add_argument("--results-dir", default="results", help="where run ids are looked up")
    compare.add_argument(
        "--output-dir", help="also write comparison.md/html, CSVs and difference.png here"
    )
    compare.add_argument(
        "--allow-different-settings",
        action="store_true",
        help="compare runs whose episode-defining settings differ (max_steps, protocol, ...), "
        "listing each difference as a warning (else they are refused)",
    )
    compare.set_defaults(handler=_compare)

    board = commands.add_parser(
        "leaderboard",
        help="one row per run (Markdown, CSV, HTML), grouped by what is comparable",
    )
    board.add_argument(
        "sources",
        nargs="*",
        default=["results"],
        help="a results directory (every run under it) or run directories (default: results)",
    )
    board.add_argument("--out", default="results/leaderboard", help="where the files go")
    board.add_argument(
        "--paired",
        action="store_true",
        help="compute each comparable pair's paired test (else print its command line)",
    )
    board.set_defaults(handler=_leaderboard)

    watcher = commands.add_parser(
        "watch",
        help="evaluate a training run's checkpoints as they appear (one evaluation at a time)",
        description="Poll DIR for complete checkpoints and run the workflow on them "
        "(checkpoints: in an overlay config), only the new episodes running; docs/training_runs.md",
    )
    watcher.add_argument("directory", help="where the training run writes its checkpoints")
    watcher.add_argument(
        "--configfile",
        nargs="+",
        required=True,
        help="the run's config file(s), as for snakemake --configfile",
    )
    watcher.add_argument(
        "--pattern", default="checkpoint-*", help="checkpoint directories in DIR (a glob)"
    )
    watcher.add_argument("--poll-s", type=float, default=60.0, help="seconds between looks")
    watcher.add_argument(
        "--stable-s",
        type=float,
        default=120.0,
        help="a checkpoint is complete once none of its files changed for this long",
    )
    watcher.add_argument("--marker", help="and once it holds this file (e.g. trainer_state.json)")
    watcher.add_argument("--cores", default="all", help="snakemake --cores")
    watcher.add_argument("--once", action="store_true", help="look once, evaluate, exit")
    watcher.add_argument(
        "snakemake_args",
        nargs="*",
        help="after --: more snakemake arguments (e.g. -- --resources gpu=8)",
    )
    watcher.set_defaults(handler=_watch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"libero-eval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
