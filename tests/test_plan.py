"""The episode plan: interleaved order, each (suite, task, init state) once, even shards."""

import pytest

from libero_eval.plan import Episode, make_shards, plan_episodes, plan_table, read_shard


def test_episodes_are_interleaved_trial_major():
    episodes = plan_episodes(["libero_spatial"], [0, 1, 2], None, 2)
    assert [(e.task_id, e.init_state_id) for e in episodes] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (1, 1),
        (2, 1),
    ]


def test_explicit_init_states_win_over_trial_count():
    episodes = plan_episodes(["libero_goal"], [3], [7, 9], 50)
    assert episodes == [Episode("libero_goal", 3, 7), Episode("libero_goal", 3, 9)]


def test_full_plan_has_2000_unique_episodes():
    suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10"]
    episodes = plan_episodes(suites, "all", None, 50)
    assert len(episodes) == 2000
    assert len(set(episodes)) == 2000


def test_libero_90_has_90_tasks():
    assert len(plan_episodes(["libero_90"], "all", None, 1)) == 90


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"suites": ["libero_100"]}, "plan.suites"),
        ({"suites": ["libero_spatial"], "task_ids": [10]}, "plan.task_ids"),
        ({"suites": ["libero_spatial"], "init_state_ids": [50]}, "plan.init_state_ids"),
        ({"suites": ["libero_spatial"], "num_trials_per_task": 51}, "plan.num_trials_per_task"),
        ({"suites": ["libero_spatial"], "task_ids": [1, 1]}, "unique"),
    ],
)
def test_bad_plan_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_episodes(**kwargs)


def test_shards_cover_every_episode_once_and_slots_evenly():
    episodes = plan_episodes(["libero_spatial", "libero_object"], "all", None, 5)
    shards = make_shards(episodes, num_slots=4, shards_per_slot=2)
    assert len(shards) == 8
    dealt = [e for s in shards for e in s.episodes]
    assert sorted(dealt) == sorted(episodes)
    assert {s.slot for s in shards} == {0, 1, 2, 3}
    sizes = [len(s.episodes) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert [s.name for s in shards][:2] == ["shard000", "shard001"]


def test_no_empty_shards_for_small_plans():
    shards = make_shards(plan_episodes(["libero_spatial"], [0], None, 3), 8, 2)
    assert len(shards) == 3
    assert all(s.episodes for s in shards)


def test_plan_table_lists_shard_and_slot():
    shards = make_shards(plan_episodes(["libero_spatial"], [0, 1], None, 2), 2, 1)
    table = plan_table(shards)
    assert list(table.columns) == ["suite", "task_id", "init_state_id", "shard", "slot"]
    assert len(table) == 4
    assert set(table["slot"]) == {0, 1}


def test_a_rollout_job_reads_back_the_shard_the_plan_wrote(tmp_path):
    """plan.csv is what rollout jobs run: each shard comes back whole, on its slot, in the
    plan's order (within a suite: trial-major, as planned)."""
    shards = make_shards(plan_episodes(["libero_spatial", "libero_goal"], [0, 1, 2], None, 3), 2, 2)
    plan_csv = tmp_path / "plan.csv"
    plan_table(shards).to_csv(plan_csv, index=False)
    for shard in shards:
        read = read_shard(plan_csv, shard.name)
        assert (read.index, read.slot, sorted(read.episodes)) == (
            shard.index,
            shard.slot,
            sorted(shard.episodes),
        )
        for suite in ("libero_spatial", "libero_goal"):
            assert [e for e in read.episodes if e.suite == suite] == [
                e for e in shard.episodes if e.suite == suite
            ]
    with pytest.raises(ValueError, match="no episodes of shard009; delete it and rerun"):
        read_shard(plan_csv, "shard009")
