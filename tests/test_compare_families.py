"""Comparing runs of two families (or protocols): the report names each run's protocol and seed;
runs whose protocol or seed differ are refused unless allowed, then warned about."""

from __future__ import annotations

import pandas as pd
import pytest

from libero_eval.analysis.comparable import SettingsDiffer
from libero_eval.analysis.compare import compare_runs, comparison_markdown
from libero_eval.report.comparison import comparison_html


def episodes(protocol: str, seed: int, successes: list[bool]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "suite": "libero_spatial",
            "task_id": 0,
            "init_state_id": range(len(successes)),
            "task_language": "pick up the black bowl",
            "success_once": successes,
            "error": None,
            "protocol": protocol,
            "seed": seed,
        }
    )


def test_same_protocol_no_warning():
    c = compare_runs(
        episodes("openpi", 7, [True, False]), episodes("openpi", 7, [True, True]), "cos", "pi"
    )
    assert c.warnings == []
    assert "Warning" not in comparison_markdown(c)


def test_different_protocols_and_seeds_are_refused_unless_allowed_then_warned_about():
    runs = episodes("rlinf", 1140, [True, False]), episodes("openpi", 7, [True, True])
    with pytest.raises(SettingsDiffer) as refused:
        compare_runs(*runs, "cosmos3_run", "pi05_run")
    assert "plan.seed: `cosmos3_run` '1140', `pi05_run` '7'" in str(refused.value)
    assert "rollout.protocol: `cosmos3_run` 'rlinf', `pi05_run` 'openpi'" in str(refused.value)
    c = compare_runs(*runs, "cosmos3_run", "pi05_run", allow_different_settings=True)
    assert len(c.warnings) == 2
    assert "plan.seed" in c.warnings[0]
    assert (
        "rollout.protocol, which defines the episodes: `cosmos3_run` rlinf, `pi05_run` openpi"
        in (c.warnings[1])
    )
    markdown = comparison_markdown(c)
    assert "| `cosmos3_run` | 2 | 1 | 0 | rlinf | 1140 |" in markdown
    assert "| `pi05_run` | 2 | 2 | 0 | openpi | 7 |" in markdown
    assert markdown.count("> **Warning.**") == 2
    assert comparison_html(c).count("<strong>Warning.</strong>") == 2
