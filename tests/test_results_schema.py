"""The per-episode Parquet schema and the aggregate built from it."""

import math

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import make_record

from libero_eval.analysis.aggregate import (
    check_complete,
    markdown_summary,
    success_tables,
    wilson_interval,
)
from libero_eval.store import RESULT_SCHEMA, read_results, write_results

REQUIRED_COLUMNS = {
    "run_id": "string",
    "suite": "string",
    "base_suite": "string",
    "task_id": "int32",
    "task_language": "string",
    "init_state_id": "int32",
    "seed": "int64",
    "reset_seeding": "string",
    "episode_seed": "int64",
    "protocol": "string",
    "success_once": "bool",
    "success_at_end": "bool",
    "first_success_step": "int32",
    "steps": "int32",
    "policy_calls": "int32",
    "policy_latency_mean_s": "double",
    "policy_latency_p50_s": "double",
    "policy_latency_p95_s": "double",
    "wall_time_s": "double",
    "server_slot": "int32",
    "server_url": "string",
    "error": "string",
}


def record(task_id, init_state_id, success, error=None, suite="libero_spatial"):
    return make_record(
        run_id="t",
        suite=suite,
        task_id=task_id,
        task_language=f"task {task_id}",
        init_state_id=init_state_id,
        success_once=success,
        success_at_end=success,
        first_success_step=100 if success else None,
        error=error,
    )


def test_parquet_schema_has_every_required_column_and_type(tmp_path):
    path = tmp_path / "shard.parquet"
    write_results([record(0, 0, True), record(1, 0, False, error="boom")], path)
    schema = pq.read_schema(path)
    for name, dtype in REQUIRED_COLUMNS.items():
        assert str(schema.field(name).type) == dtype, name
    assert schema.equals(RESULT_SCHEMA, check_metadata=False)


def test_rows_keep_suite_and_base_suite_and_older_tables_gain_it(tmp_path):
    path = tmp_path / "shard.parquet"
    write_results([record(0, 0, True), record(0, 0, True, suite="libero_spatial_swap")], path)
    frame = read_results([path])
    assert list(frame["suite"]) == ["libero_spatial", "libero_spatial_swap"]
    assert list(frame["base_suite"]) == ["libero_spatial", "libero_spatial"]
    older = tmp_path / "older.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["base_suite"]), older)
    assert list(read_results([older])["base_suite"]) == ["libero_spatial", "libero_spatial"]


def test_null_first_success_step_round_trips(tmp_path):
    path = tmp_path / "shard.parquet"
    write_results([record(0, 0, False)], path)
    frame = read_results([path])
    assert pd.isna(frame.loc[0, "first_success_step"])


def test_truncated_parquet_is_a_clear_error(tmp_path):
    path = tmp_path / "shard000.parquet"
    write_results([record(0, 0, True)], path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="shard000.parquet.*truncated.*rerun"):
        read_results([path])


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (1, 4, 0.0456, 0.6994)],
)
def test_wilson_interval_matches_known_values(k, n, low, high):
    got_low, got_high = wilson_interval(k, n, 0.95)
    assert got_low == pytest.approx(low, abs=1e-4)
    assert got_high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_of_nothing_is_nan():
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_tables_per_task_suite_and_overall():
    frame = read_frame(
        [record(0, 0, True), record(0, 1, False), record(1, 0, True), record(1, 1, True)]
    )
    table = success_tables(frame)
    overall = table[table["level"] == "overall"].iloc[0]
    assert overall["num_trajectories"] == 4
    assert overall["success_once"] == pytest.approx(0.75)
    task0 = table[(table["level"] == "task") & (table["task_id"] == 0)].iloc[0]
    assert task0["success_once"] == pytest.approx(0.5)
    assert task0["num_trajectories"] == 2
    suite = table[table["level"] == "suite"].iloc[0]
    assert suite["suite"] == "libero_spatial"
    assert "| libero_spatial | (suite) | 75.0%" in markdown_summary(table, "t")


def test_errored_episodes_count_as_failures_and_are_listed():
    frame = read_frame([record(0, 0, True), record(0, 1, False, error="EnvError: x")])
    task0 = success_tables(frame).query("level == 'task'").iloc[0]
    assert task0["num_errors"] == 1
    assert task0["success_once"] == pytest.approx(0.5)


def test_every_planned_episode_must_have_exactly_one_row():
    plan = pd.DataFrame(
        {"suite": ["libero_spatial"] * 2, "task_id": [0, 1], "init_state_id": [0, 0]}
    )
    with pytest.raises(ValueError, match="no result row"):
        check_complete(read_frame([record(0, 0, True)]), plan)
    with pytest.raises(ValueError, match="count once"):
        check_complete(read_frame([record(0, 0, True), record(0, 0, True)]), plan)


def read_frame(records):
    import pyarrow as pa

    from libero_eval.store import records_to_table

    table: pa.Table = records_to_table(records)
    return table.to_pandas()
