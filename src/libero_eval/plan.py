"""Episode planning: suites × tasks × init states → interleaved episodes → shards → slots.

Planning never imports LIBERO, so a 2,000-episode DAG builds in well under a second.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# pandas only where plan.csv is written or read: Snakemake plans at parse time without it
if TYPE_CHECKING:
    import pandas as pd

from libero_eval import settings_schema
from libero_eval import suites as suite_catalog

# Tasks per suite and init states per task in the five LIBERO suites; perturbation suites
# differ (`libero_eval.suites` knows every registered suite's tasks and init states).
SUITE_NUM_TASKS = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}


@dataclass(frozen=True, order=True)
class Episode:
    """One (suite, task, init state) to evaluate, under run seed `seed` when the run has
    several (`plan.seeds`); it counts exactly once. A single-seed run's episodes have no seed
    of their own (None: the run's one seed), so their keys and store paths are unchanged."""

    suite: str
    task_id: int
    init_state_id: int
    seed: int | None = None

    @property
    def key(self) -> str:
        key = f"{self.suite}/task{self.task_id:02d}/init{self.init_state_id:02d}"
        return key if self.seed is None else f"{key}/seed{self.seed}"


@dataclass(frozen=True)
class Shard:
    """A batch of episodes run by one rollout job against one server slot."""

    index: int
    slot: int
    episodes: tuple[Episode, ...]

    @property
    def name(self) -> str:
        return shard_name(self.index)


def shard_name(index: int) -> str:
    return f"shard{index:03d}"


def _resolve_ids(value, count: int, field: str) -> list[int]:
    if value == "all":
        return list(range(count))
    ids = [int(v) for v in value]
    bad = [v for v in ids if not 0 <= v < count]
    if bad:
        raise ValueError(f"{field}: ids {bad} out of range; valid ids are 0..{count - 1}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{field}: ids must be unique, got {ids}")
    return ids


def check_seeds(seeds: Sequence[int] | None) -> list[int] | None:
    """`plan.seeds` as a list (None when not set); a ValueError names a repeated seed."""
    if seeds is None:
        return None
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("plan.seeds: list at least one seed (or null for plan.seed)")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"plan.seeds: seed(s) {repeated} listed more than once in {seeds}; each seed runs "
            "every episode once, so list each seed once"
        )
    return seeds


def plan_episodes(
    suites: Sequence[str],
    task_ids: str | Sequence[int] = settings_schema.default("plan", "task_ids"),
    init_state_ids: Sequence[int] | None = None,
    num_trials_per_task: int = 1,
    seeds: Sequence[int] | None = None,
) -> list[Episode]:
    """The interleaved episode list: per suite, trial-major (task0/trial0, task1/trial0, ...).

    `suites` may hold patterns (`libero_eval.suites.expand_suites`). `init_state_ids`
    (explicit) wins over `num_trials_per_task` (the first N init states). Every selected task
    must be able to run; otherwise a ValueError names the suite, the tasks and the reason.
    With several `seeds` the whole list repeats once per seed, seed-major (seed order as
    listed), each episode carrying its seed; with one seed (or None) episodes carry none.
    """
    seeds = check_seeds(seeds)
    episodes: list[Episode] = []
    for suite in suite_catalog.expand_suites(list(suites)):
        entries = suite_catalog.tasks(suite)
        tasks = _resolve_ids(task_ids, len(entries), f"plan.task_ids (suite {suite})")
        refused = {t: entries[t].refusal for t in tasks if entries[t].refusal}
        if refused:
            runnable = suite_catalog.runnable_task_ids(suite)
            raise suite_catalog.SuiteError(
                f"plan.suites: {suite} tasks {sorted(refused)} cannot run: "
                f"{next(iter(refused.values()))}. Set plan.task_ids to runnable tasks "
                f"({runnable}) or remove the suite (e.g. '!{suite}' after a pattern)."
            )
        available = min(entries[t].num_init_states for t in tasks)
        if init_state_ids is not None:
            trials = _resolve_ids(init_state_ids, available, f"plan.init_state_ids ({suite})")
        else:
            if not 1 <= num_trials_per_task <= available:
                raise ValueError(
                    f"plan.num_trials_per_task: {num_trials_per_task} is outside 1..{available} "
                    f"({suite} stores {available} init states per task); lower it, or list "
                    "plan.init_state_ids"
                )
            trials = list(range(num_trials_per_task))
        episodes += [Episode(suite, t, i) for i in trials for t in tasks]
    if seeds is not None and len(seeds) > 1:
        return [Episode(e.suite, e.task_id, e.init_state_id, s) for s in seeds for e in episodes]
    return episodes


def episodes_from_table(table: pd.DataFrame) -> list[Episode]:
    """Episodes of a plan table (plan.csv), with their seeds where it has a `seed` column."""
    keys = ["suite", "task_id", "init_state_id"]
    if "seed" in table.columns:
        return [
            Episode(str(suite), int(task), int(init), int(seed))
            for suite, task, init, seed in table[[*keys, "seed"]].itertuples(index=False)
        ]
    return [
        Episode(str(suite), int(task), int(init))
        for suite, task, init in table[keys].itertuples(index=False)
    ]


def make_shards(episodes: Sequence[Episode], num_slots: int, shards_per_slot: int) -> list[Shard]:
    """Deal episodes round-robin into num_slots × shards_per_slot shards (empty ones dropped).

    Shard i runs against slot i % num_slots, so every slot gets the same number of shards.
    """
    if num_slots < 1 or shards_per_slot < 1:
        raise ValueError("server.num_slots and rollout.shards_per_slot must be >= 1")
    num_shards = min(num_slots * shards_per_slot, len(episodes))
    buckets: list[list[Episode]] = [[] for _ in range(num_shards)]
    for position, episode in enumerate(episodes):
        buckets[position % num_shards].append(episode)
    return [Shard(i, i % num_slots, tuple(b)) for i, b in enumerate(buckets)]


def read_shard(plan_csv: str | Path, name: str) -> Shard:
    """Shard `name` as `plan_table` wrote it to `plan_csv` (its episodes in the file's order)."""
    import pandas as pd

    table = pd.read_csv(plan_csv)
    rows = table[table["shard"] == name]
    if rows.empty:
        raise ValueError(f"{plan_csv}: no episodes of {name}; delete it and rerun the workflow")
    slots = set(rows["slot"])
    if len(slots) != 1:
        raise ValueError(f"{plan_csv}: {name} is planned on several slots {sorted(slots)}")
    episodes = tuple(episodes_from_table(rows))
    return Shard(int(name.removeprefix("shard")), int(slots.pop()), episodes)


def plan_table(shards: Iterable[Shard]) -> pd.DataFrame:
    """The plan as a table: one row per episode with its shard and slot, and its seed when the
    run has several (a single-seed plan.csv has today's columns)."""
    shards = list(shards)
    seeded = any(ep.seed is not None for shard in shards for ep in shard.episodes)
    rows = [
        {**asdict(ep), "shard": shard.name, "slot": shard.slot}
        for shard in shards
        for ep in shard.episodes
    ]
    import pandas as pd

    keys = ["suite", "task_id", "init_state_id"]
    columns = [*keys, *(["seed"] if seeded else []), "shard", "slot"]
    order = ["suite", *(["seed"] if seeded else []), "init_state_id", "task_id"]
    return pd.DataFrame(rows, columns=columns).sort_values(order, ignore_index=True)
