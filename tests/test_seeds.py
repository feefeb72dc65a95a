"""Several seeds in one run (plan.seeds): the plan, the store, the fingerprint, the seeds'
spread in the summary, and the errors for a bad seed list."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_record

from libero_eval.analysis.aggregate import write_summary
from libero_eval.config import ConfigError, RunSettings, check_config, planned_episodes
from libero_eval.plan import Episode, make_shards, plan_episodes, plan_table, read_shard
from libero_eval.policy.adapter import Observation
from libero_eval.policy.families.cosmos3.adapter import Cosmos3Adapter
from libero_eval.store import EpisodeStore, write_results


def with_seeds(config: dict, seeds) -> dict:
    config = copy.deepcopy(config)
    config["plan"]["seeds"] = seeds
    return config


def test_each_episode_runs_once_per_seed_seed_major_and_plan_csv_round_trips(tmp_path):
    single = plan_episodes(["libero_spatial"], [0, 1], [0])
    seeded = plan_episodes(["libero_spatial"], [0, 1], [0], seeds=[3, 1, 2])
    assert [e.seed for e in seeded] == [3, 3, 1, 1, 2, 2]
    assert [(e.task_id, e.init_state_id) for e in seeded[:2]] == [
        (e.task_id, e.init_state_id) for e in single
    ]
    assert seeded[0].key == "libero_spatial/task00/init00/seed3"
    assert single[0].key == "libero_spatial/task00/init00"  # one seed: today's key
    assert plan_episodes(["libero_spatial"], [0], [0], seeds=[5]) == [
        Episode("libero_spatial", 0, 0)
    ]
    shards = make_shards(seeded, 1, 2)
    table = plan_table(shards)
    assert list(table.columns) == ["suite", "task_id", "init_state_id", "seed", "shard", "slot"]
    assert "seed" not in plan_table(make_shards(single, 1, 1)).columns
    table.to_csv(tmp_path / "plan.csv", index=False)
    back = [e for s in shards for e in read_shard(tmp_path / "plan.csv", s.name).episodes]
    assert sorted(back) == sorted(seeded)


def test_a_seed_list_with_duplicates_or_beside_plan_seed_is_refused(default_config):
    with pytest.raises(ConfigError, match=r"plan.seeds: seed\(s\) \[1\] listed more than once"):
        check_config(with_seeds(default_config, [0, 1, 1]))
    both = with_seeds(default_config, [0, 1])
    both["plan"]["seed"] = 0
    with pytest.raises(ConfigError, match="plan.seed .* and plan.seeds .* are both set"):
        check_config(both)


def test_fingerprint_ignores_the_seed_list_so_a_run_can_append_seeds(default_config):
    base = RunSettings(copy.deepcopy(default_config)).fingerprint
    one = copy.deepcopy(default_config)
    one["plan"]["seed"] = 0  # rlinf's own seed, spelled out
    assert RunSettings(one).fingerprint == base
    assert RunSettings(with_seeds(default_config, [0, 1, 2])).fingerprint == base
    assert RunSettings(with_seeds(default_config, [0, 1, 2, 3])).fingerprint == base
    assert RunSettings(with_seeds(default_config, [5, 0])).fingerprint != base
    assert len(planned_episodes(with_seeds(default_config, [0, 1, 2]))) == 3 * 4


def test_seeded_episode_reuses_the_single_seed_record_of_its_seed_only(tmp_path):
    store = EpisodeStore(tmp_path)
    single = Episode("libero_spatial", 0, 0)
    store.write(single, make_record(seed=0))
    assert store.path_for(single).name == "task00_init00.json"
    assert store.path_for(Episode("libero_spatial", 0, 0, 1)).name == "task00_init00_seed1.json"
    assert store.load(Episode("libero_spatial", 0, 0, 0))["seed"] == 0
    assert store.load(Episode("libero_spatial", 0, 0, 1)) is None
    store.write(Episode("libero_spatial", 0, 0, 1), make_record(seed=1))
    assert set(store.finished([Episode("libero_spatial", 0, 0, s) for s in (0, 1, 2)])) == {
        Episode("libero_spatial", 0, 0, 0),
        Episode("libero_spatial", 0, 0, 1),
    }


def test_cosmos3_requests_never_mix_seeds_and_shift_the_sampling_seed(default_config):
    adapter = RunSettings(default_config).adapter
    assert isinstance(adapter, Cosmos3Adapter)
    image = np.zeros((128, 128, 3), np.uint8)

    def obs(offset: int) -> Observation:
        return Observation(image, image, "pick up the bowl", sampling_seed_offset=offset)

    assert adapter.prompt_key(obs(0)) != adapter.prompt_key(obs(2))
    base = adapter.build_request([obs(0)], "a")["parameters"]["seed"]
    assert adapter.build_request([obs(2), obs(2)], "b")["parameters"]["seed"] == base + 2
    assert adapter.build_request([obs(0)], "c")["input"]["prompt"] == adapter.prompt_key(obs(0))
    with pytest.raises(ValueError, match="one sampling seed"):
        adapter.build_request([obs(0), obs(1)], "d")


def seeded_run(tmp_path, outcomes: dict[int, list[bool]]) -> dict[str, str]:
    """A finished run of 2 tasks x (len(outcomes[s]) // 2) init states per seed, written
    through the store's own writer and summarized by write_summary."""
    records, plan = [], []
    for seed, wins in outcomes.items():
        for index, win in enumerate(wins):
            task, init = index % 2, index // 2
            records.append(
                make_record(
                    suite="libero_spatial",
                    task_id=task,
                    task_language=f"task {task}",
                    init_state_id=init,
                    seed=seed,
                    success_once=win,
                    success_at_end=win,
                    steps=100,
                )
            )
            plan.append({"suite": "libero_spatial", "task_id": task, "init_state_id": init})
            if len(outcomes) > 1:
                plan[-1]["seed"] = seed
    write_results(records, tmp_path / "shard000.parquet")
    pd.DataFrame(plan).to_csv(tmp_path / "plan.csv", index=False)
    names = ["episodes", "per_task", "per_suite", "per_seed", "tables", "markdown"]
    suffix = {"episodes": "parquet", "tables": "parquet", "markdown": "md"}
    outputs = {k: str(tmp_path / f"{k}.{suffix.get(k, 'csv')}") for k in names}
    write_summary([str(tmp_path / "shard000.parquet")], str(tmp_path / "plan.csv"), outputs, "r")
    return outputs


def test_summary_gives_each_seeds_rate_their_mean_and_sd_and_the_pooled_wilson_rate(tmp_path):
    outputs = seeded_run(
        tmp_path, {0: [True] * 4, 1: [True, True, False, False], 2: [True, False, False, False]}
    )
    per_seed = pd.read_csv(outputs["per_seed"])
    suite = per_seed[per_seed["level"] == "suite"].set_index("seed")["success_once"]
    assert suite.to_dict() == {0: 1.0, 1: 0.5, 2: 0.25}
    overall = pd.read_csv(outputs["per_suite"]).set_index("suite").loc["all"]
    assert overall["num_trajectories"] == 12 and overall["success_once"] == pytest.approx(7 / 12)
    assert overall["num_seeds"] == 3
    assert overall["success_once_seed_mean"] == pytest.approx(np.mean([1, 0.5, 0.25]))
    assert overall["success_once_seed_std"] == pytest.approx(np.std([1, 0.5, 0.25], ddof=1))
    task0 = pd.read_csv(outputs["per_task"]).set_index("task_id").loc[0]
    assert task0["success_once_seed_mean"] == pytest.approx(np.mean([1, 0.5, 0.5]))
    tables = pd.read_parquet(outputs["tables"])
    assert {"success_at_end_seed_std", "num_seeds"} <= set(tables.columns)
    markdown = Path(outputs["markdown"]).read_text()
    assert "## Seeds" in markdown
    assert "| libero_spatial | success_once | 58.3% [" in markdown
    assert "58.3 ± 38.2 | 100.0% | 50.0% | 25.0% |" in markdown


def test_several_seeds_keep_task_ids_integers_in_every_output(tmp_path):
    """The seeds' spread is merged into the tables; the task ids stay integers there (they
    came out as 0.0, 1.0 in per_task.csv, the tables and summary.md's task rows)."""
    outputs = seeded_run(tmp_path, {0: [True, False, True, True], 1: [True, True, False, True]})
    assert pd.read_csv(outputs["per_task"], dtype=str)["task_id"].tolist() == ["0", "1"]
    tables = pd.read_parquet(outputs["tables"])
    assert str(tables["task_id"].dtype) == "Int64"
    assert tables["task_id"].dropna().tolist() == [0, 1]
    markdown = Path(outputs["markdown"]).read_text()
    assert "| libero_spatial | 0: task 0 |" in markdown
    assert "| 0.0:" not in markdown and "| 1.0:" not in markdown


def test_single_seed_summary_has_no_seed_columns_or_section(tmp_path):
    outputs = seeded_run(tmp_path, {0: [True, False, True, True]})
    assert "seed" not in "".join(pd.read_csv(outputs["per_suite"]).columns)
    assert "## Seeds" not in Path(outputs["markdown"]).read_text()
    per_seed = pd.read_csv(outputs["per_seed"])
    assert set(per_seed["seed"]) == {0}


def test_a_missing_seed_is_an_incomplete_run(tmp_path):
    outputs = seeded_run(tmp_path, {0: [True, True], 1: [False, True]})
    plan = pd.read_csv(tmp_path / "plan.csv")
    extra = plan.iloc[[0]].assign(seed=2)
    pd.concat([plan, extra]).to_csv(tmp_path / "plan.csv", index=False)
    with pytest.raises(ValueError, match="1 planned episodes have no result row.*'seed': 2"):
        write_summary(
            [str(tmp_path / "shard000.parquet")], str(tmp_path / "plan.csv"), outputs, "r"
        )


def test_report_draws_each_seeds_rate_per_suite_and_the_spread_table(tmp_path):
    from test_report import assert_chart_png

    from libero_eval import report

    outputs = seeded_run(tmp_path, {0: [True] * 4, 1: [True, False] * 2, 2: [False] * 4})
    written = {
        "success_by_seed": tmp_path / "seeds.png",
        "success_table": tmp_path / "table.html",
    }
    report.write_report_outputs(outputs["episodes"], outputs["tables"], written, {})
    assert_chart_png(written["success_by_seed"])
    page = written["success_table"].read_text()
    assert "<h2>Seeds</h2>" in page and "50.0 ± 50.0" in page
