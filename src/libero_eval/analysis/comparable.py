"""Whether two runs' episodes are the same episodes: what pairs them (`pair_keys`), the
settings that define them as each run recorded them (`recorded_settings`), and where two runs
differ (`setting_differences`); `libero_eval.analysis.compare` refuses runs that differ
(`SettingsDiffer`) unless its caller allows it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval import settings_schema

PAIR_KEYS = ["suite", "task_id", "init_state_id"]
SETTINGS_FILE = Path("summary") / "settings.json"  # what a run recorded of its settings
# episode columns that say how the episode was defined, by the setting they come from
EPISODE_SETTINGS = {"protocol": "rollout.protocol", "reset_seeding": "rollout.reset_seeding"}


class SettingsDiffer(ValueError):
    """Two runs whose episodes were defined by different settings; the message names each."""


@dataclass(frozen=True)
class SettingDifference:
    """One episode-defining setting with different values in the two runs."""

    setting: str  # its config path, e.g. rollout.max_steps
    baseline: Any
    candidate: Any

    def line(self, baseline: str, candidate: str) -> str:
        return f"{self.setting}: `{baseline}` {self.baseline!r}, `{candidate}` {self.candidate!r}"


def recorded_settings(run_dir: str | Path) -> dict[str, Any] | None:
    """The episode-defining settings run `run_dir` recorded: `summary/settings.json` (the
    aggregate step writes it, `RunSettings.recorded_settings`), else the config kept in
    `report/provenance.json` by runs aggregated before it, its rollout section without the
    fields the schema marks outcome-neutral; None when the run recorded neither."""
    run_dir = Path(run_dir)
    try:
        return json.loads((run_dir / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        pass
    try:
        config = json.loads((run_dir / "report" / "provenance.json").read_text())["config"]
        rollout = config["rollout"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"rollout": settings_schema.without_outcome_neutral(rollout, "rollout")}


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, Mapping):
            flat |= _flat(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def setting_differences(
    baseline: pd.DataFrame,
    candidate: pd.DataFrame,
    settings: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
) -> list[SettingDifference]:
    """The episode-defining settings in which the runs differ: from their episode rows (the
    protocol, the reset seeding, and the seed where each run has one, so that pairs do not
    match seeds) and from the settings each recorded (`recorded_settings`; a setting one of
    them lacks is not compared)."""

    def values(episodes: pd.DataFrame, column: str) -> str | None:
        if column not in episodes.columns:
            return None
        found = sorted(str(v) for v in episodes[column].dropna().unique())
        return ", ".join(found) if found else None

    found: dict[str, SettingDifference] = {}
    columns = dict(EPISODE_SETTINGS)
    if "seed" not in pair_keys(baseline, candidate):
        columns["seed"] = "plan.seed"
    for column, setting in columns.items():
        base, cand = values(baseline, column), values(candidate, column)
        if base is not None and cand is not None and base != cand:
            found[setting] = SettingDifference(setting, base, cand)
    if settings[0] is not None and settings[1] is not None:
        base_flat, cand_flat = _flat(settings[0]), _flat(settings[1])
        for setting in sorted(base_flat.keys() & cand_flat.keys()):
            if base_flat[setting] != cand_flat[setting]:
                found[setting] = SettingDifference(setting, base_flat[setting], cand_flat[setting])
    return sorted(found.values(), key=lambda d: d.setting)


def pair_keys(*runs: pd.DataFrame) -> list[str]:
    """What pairs two runs' episodes: (suite, task_id, init_state_id), and the seed when a run
    has several seeds (plan.seeds): episode i of seed s pairs with episode i of seed s."""
    several = any("seed" in r.columns and r["seed"].nunique() > 1 for r in runs)
    return [*PAIR_KEYS, "seed"] if several else list(PAIR_KEYS)
