"""The episode-video page: the first successes and failures of each task, embedded."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from libero_eval import settings_schema
from libero_eval.report.tables import html_page

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")


def select_videos(
    episodes: pd.DataFrame, per_task: int = REPORT["videos_per_task"]
) -> pd.DataFrame:
    """The first `per_task` successes and failures (by init state) of each task with a video."""
    if "video_path" not in episodes.columns or per_task < 1:
        return episodes.iloc[0:0]
    recorded = episodes[episodes["video_path"].notna()]
    recorded = recorded.sort_values(["suite", "task_id", "init_state_id"])
    outcome = recorded["success_once"].astype(bool)
    return (
        recorded.groupby([recorded["suite"], recorded["task_id"], outcome], sort=True)
        .head(per_task)
        .sort_values(["suite", "task_id", "init_state_id"], ignore_index=True)
    )


def videos_html(
    selected: pd.DataFrame, num_recorded: int = 0, max_bytes_per_video: int = 20_000_000
) -> str:
    """Each selected video embedded as a data URI, captioned suite/task/init and outcome."""
    if not len(selected):
        if num_recorded:
            note = (
                f"{num_recorded} episode videos were recorded and none selected: raise "
                "<code>report.videos_per_task</code> to show some here."
            )
        else:
            note = (
                "No episode videos were recorded. Set <code>rollout.videos.enabled: true</code> "
                "to record them."
            )
        return html_page("Episode videos", f"<p>{note}</p>")
    parts = [
        f"<p>{len(selected)} videos: per task, the first successes and failures by init state. "
        "Files on disk are named results/&lt;run&gt;/videos/&lt;suite&gt;/"
        "taskTT_initII_{success|failure}.mp4.</p>"
    ]
    for (suite, task_id), group in selected.groupby(["suite", "task_id"], sort=True):
        language = group["task_language"].dropna()
        title = f"{suite} task {int(task_id)}" + (f": {language.iloc[0]}" if len(language) else "")
        parts.append(f"<h2>{html.escape(title)}</h2>")
        for row in group.itertuples():
            path = Path(row.video_path)
            outcome = "success" if row.success_once else "failure"
            caption = f"{suite}/task{int(task_id):02d}/init{int(row.init_state_id):02d}: {outcome}"
            if not path.is_file():
                parts.append(
                    f"<p>{html.escape(caption)}: missing file {html.escape(str(path))}</p>"
                )
                continue
            if path.stat().st_size > max_bytes_per_video:
                parts.append(
                    f"<p>{html.escape(caption)}: {html.escape(str(path))} "
                    f"({path.stat().st_size} bytes, too large to embed)</p>"
                )
                continue
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(
                f'<figure><video controls muted loop preload="metadata" '
                f'src="data:video/mp4;base64,{data}"></video>'
                f"<figcaption>{html.escape(caption)}<br><code>{html.escape(str(path))}</code>"
                "</figcaption></figure>"
            )
    return html_page("Episode videos", "\n".join(parts))
