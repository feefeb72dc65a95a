"""Report material: figures (matplotlib, Agg), HTML tables, provenance and episode-video pages.

This package only renders: the statistics are `libero_eval.analysis`'s, and a table's cells
are formatted by `libero_eval.analysis.display`, as in summary.md. Everything here reads the
aggregated tables (`results/<run>/summary/episodes.parquet` and `summary.parquet`) and writes
self-contained files: PNG figures, HTML pages that embed their data (videos as data URIs),
JSON provenance. The workflow's figure rule marks them for `snakemake --report`. One module
per kind of output: `figures`, `tables`, `seeds`, `provenance`, `videos`, `efficiency` (each
slot's use of its server), `comparison` (two runs side by side), `robustness` and
`leaderboard`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval import settings_schema
from libero_eval.analysis.aggregate import per_seed_table, seeds_cells, steps_note
from libero_eval.analysis.errors import failures_by_error
from libero_eval.analysis.published import published_checks
from libero_eval.report.comparison import comparison_html, difference_figure, write_comparison
from libero_eval.report.figures import (
    METRIC_LABELS,
    first_success_step_figure,
    latency_over_time_figure,
    save_figure,
    success_by_suite_figure,
    success_by_task_figure,
    throughput_over_time_figure,
)
from libero_eval.report.provenance import (
    PROVENANCE_PACKAGES,
    file_sha256,
    git_state,
    package_versions,
    provenance,
    provenance_html,
)
from libero_eval.report.seeds import seeds_html, success_by_seed_figure
from libero_eval.report.tables import (
    failures_html,
    html_page,
    success_overview_rst,
    success_table_html,
)
from libero_eval.report.videos import select_videos, videos_html

__all__ = [
    "METRIC_LABELS",
    "PROVENANCE_PACKAGES",
    "comparison_html",
    "difference_figure",
    "failures_html",
    "file_sha256",
    "first_success_step_figure",
    "git_state",
    "html_page",
    "latency_over_time_figure",
    "package_versions",
    "provenance",
    "provenance_html",
    "save_figure",
    "seeds_html",
    "select_videos",
    "success_by_seed_figure",
    "success_by_suite_figure",
    "success_by_task_figure",
    "success_overview_rst",
    "success_table_html",
    "throughput_over_time_figure",
    "videos_html",
    "write_comparison",
    "write_report_outputs",
]


class _Run:
    """One run's inputs to the report, each read or built once."""

    def __init__(self, episodes, table, config, repo_dir, fingerprint, action_stats, checkpoint):
        self.episodes, self.table, self.config = episodes, table, config
        self.repo_dir, self.fingerprint, self.action_stats = repo_dir, fingerprint, action_stats
        self.checkpoint = checkpoint  # a training run's checkpoint (its record), or None
        # the validated config has every default; a partial one takes the schema's
        report = {**settings_schema.defaults("report"), **config.get("report", {})}
        self.confidence = report["confidence_level"]
        self.decimals = report["decimals"]
        self.videos_per_task = report["videos_per_task"]
        self.alpha = report["published_alpha"]
        self.published = published_checks(
            table, report["published"], report["published_metric"], self.alpha
        )
        self._provenance: dict[str, Any] | None = None

    @cached_property
    def seeds(self) -> pd.DataFrame | None:
        """The seeds' table as summary.md has it (None for a single seed)."""
        per_seed = per_seed_table(self.episodes, self.confidence)
        return seeds_cells(self.table, per_seed, self.decimals)

    def provenance(self) -> dict[str, Any]:
        if self._provenance is None:
            self._provenance = provenance(
                self.config,
                self.repo_dir,
                self.fingerprint,
                self.episodes,
                self.action_stats,
                self.checkpoint,
            )
        return self._provenance


def _figure(draw: Callable[[_Run], Any]) -> Callable[[_Run, Path], None]:
    return lambda run, path: save_figure(draw(run), path)


def _text(render: Callable[[_Run], str]) -> Callable[[_Run, Path], None]:
    return lambda run, path: path.write_text(render(run))


# The figure rule's and the video rule's output keys, each with what writes it.
OUTPUT_WRITERS: dict[str, Callable[[_Run, Path], None]] = {
    "success_by_task": _figure(lambda r: success_by_task_figure(r.table, r.confidence)),
    "success_by_suite": _figure(lambda r: success_by_suite_figure(r.table, r.confidence)),
    "success_table": _text(
        lambda r: success_table_html(
            r.table,
            r.confidence,
            r.decimals,
            r.published,
            r.alpha,
            seeds_html(r.seeds, r.confidence),
        )
    ),
    "success_by_seed": _figure(lambda r: success_by_seed_figure(r.episodes, r.confidence)),
    "first_success_step": _figure(lambda r: first_success_step_figure(r.episodes)),
    "latency_over_time": _figure(lambda r: latency_over_time_figure(r.episodes)),
    "throughput_over_time": _figure(lambda r: throughput_over_time_figure(r.episodes)),
    "failures_csv": lambda r, path: failures_by_error(r.episodes).to_csv(path, index=False),
    "failures_html": _text(lambda r: failures_html(failures_by_error(r.episodes), len(r.episodes))),
    "provenance_json": _text(
        lambda r: json.dumps(r.provenance(), indent=2, sort_keys=True, default=str) + "\n"
    ),
    "provenance_html": _text(lambda r: provenance_html(r.provenance())),
    "overview": _text(
        lambda r: success_overview_rst(
            r.table,
            str(r.config.get("run_id", "")),
            r.confidence,
            r.decimals,
            steps_note(
                r.episodes["protocol"].dropna().unique(),
                (r.config.get("rollout") or {}).get("max_steps"),
            ),
        )
    ),
    "videos": _text(
        lambda r: videos_html(
            select_videos(r.episodes, r.videos_per_task),
            int(r.episodes["video_path"].notna().sum()),
        )
    ),
}


def write_report_outputs(
    episodes_path: str | Path,
    tables_path: str | Path,
    outputs: dict[str, str | Path],
    config: dict[str, Any],
    repo_dir: str | Path = ".",
    fingerprint: str | None = None,
    action_stats: dict[str, str | None] | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> None:
    """Write each output named in `outputs` (keys of OUTPUT_WRITERS). `action_stats` is the
    client's statistics file as the run's settings read it (`RunSettings.action_stats`);
    `checkpoint`, a training run's checkpoint as its summary records it
    (`libero_eval.checkpoints.checkpoint_record`)."""
    from libero_eval.store import read_results

    unknown = sorted(set(outputs) - OUTPUT_WRITERS.keys())
    if unknown:
        raise ValueError(f"unknown report output {unknown[0]!r}; known: {sorted(OUTPUT_WRITERS)}")
    run = _Run(
        read_results([episodes_path]),
        pd.read_parquet(tables_path),
        config,
        repo_dir,
        fingerprint,
        action_stats,
        checkpoint,
    )
    for key, path in outputs.items():
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT_WRITERS[key](run, path)
