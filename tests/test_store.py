"""The episode store: durable, atomic per-episode records and the shard Parquet tables."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import make_record

from libero_eval.plan import Episode
from libero_eval.store import (
    RESULT_COLUMNS,
    RESULT_SCHEMA,
    DiskFullError,
    EpisodeStore,
    atomic_write_bytes,
    fingerprint,
    read_results,
    write_results,
)

EPISODES = [Episode("libero_spatial", task, init) for task in (0, 1) for init in (0, 1, 2)]


def record(episode: Episode, **overrides) -> dict:
    """A complete result row for `episode` (deterministic values derived from its ids)."""
    row = make_record(
        run_id="store_test",
        suite=episode.suite,
        base_suite=episode.suite,
        task_id=episode.task_id,
        task_language=f"task {episode.task_id}",
        init_state_id=episode.init_state_id,
        success_once=episode.init_state_id % 2 == 0,
        success_at_end=episode.init_state_id == 0,
        first_success_step=40 + episode.task_id if episode.init_state_id % 2 == 0 else None,
        wall_time_s=12.5,
        server_url="http://127.0.0.1:30000",
        finished_at=time.time(),
    )
    row.update(overrides)
    return row


def test_a_written_record_loads_back_from_its_own_file(tmp_path):
    store = EpisodeStore(tmp_path)
    episode = Episode("libero_goal", 3, 7)
    path = store.write(episode, record(episode))
    assert path == tmp_path / "libero_goal" / "task03_init07.json"
    assert store.load(episode) == json.loads(path.read_text())
    assert store.load(Episode("libero_goal", 3, 8)) is None


def test_finished_skips_missing_and_errored_episodes_so_a_rerun_redoes_them(tmp_path):
    store = EpisodeStore(tmp_path)
    ok, errored, missing = EPISODES[:3]
    store.write(ok, record(ok))
    store.write(errored, record(errored, error="RuntimeError: env exploded"))
    assert list(store.finished([ok, errored, missing])) == [ok]


@pytest.mark.parametrize(
    "damage",
    [b"", b'{"suite": "libero_spatial", "task_id"', b"\x00\xff not json"],
    ids=["empty", "truncated", "garbage"],
)
def test_an_unreadable_record_is_ignored_with_a_message_and_rerun(tmp_path, capsys, damage):
    store = EpisodeStore(tmp_path)
    episode = EPISODES[0]
    path = store.write(episode, record(episode))
    path.write_bytes(damage)
    assert store.load(episode) is None
    assert store.finished([episode]) == {}
    assert str(path) in capsys.readouterr().err


def test_a_record_missing_result_columns_is_ignored(tmp_path, capsys):
    store = EpisodeStore(tmp_path)
    episode = EPISODES[0]
    incomplete = record(episode)
    del incomplete["steps"], incomplete["success_once"]
    store.path_for(episode).parent.mkdir(parents=True)
    store.path_for(episode).write_text(json.dumps(incomplete))
    assert store.load(episode) is None
    assert f"{store.path_for(episode)}: missing steps, success_once" in capsys.readouterr().err


def bad(episode: Episode) -> dict[str, object]:
    """Contents that cannot stand for `episode`'s record, by what is wrong with them."""
    other = Episode(episode.suite, episode.task_id + 1, episode.init_state_id)
    return {
        "a list": [],
        "null": None,
        "a string": "done",
        "a wrongly typed field": record(episode, success_once="maybe"),
        "a fractional step count": record(episode, steps=31.5),
        "a null where none is allowed": record(episode, success_at_end=None),
        "a number too large": record(episode, seed=2**70),
        "another episode's record": record(other),
    }


REASONS = {
    "a list": "not a JSON object but list",
    "null": "not a JSON object but null",
    "a string": "not a JSON object but str",
    "a wrongly typed field": "success_once is 'maybe', not of type bool",
    "a fractional step count": "steps is 31.5, not of type int32",
    "a null where none is allowed": "success_at_end is null",
    "a number too large": "not a result row",
    "another episode's record": "the record of libero_spatial task 1 init state 0, not of "
    "libero_spatial task 0 init state 0",
}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_a_bad_record_is_named_rerun_and_set_aside_never_deleted(tmp_path, capsys, kind):
    """`[]`, `null`, a wrongly typed field or a record copied over another episode's file:
    the store names the file and why, the episode counts as unfinished (the DAG reruns it),
    and the rerun's write moves the bad file (byte for byte) with its reason into
    quarantine/ before its own record takes the place."""
    store = EpisodeStore(tmp_path)
    episode = EPISODES[0]
    path = store.path_for(episode)
    path.parent.mkdir(parents=True)
    content = json.dumps(bad(episode)[kind]).encode()
    path.write_bytes(content)

    assert store.load(episode) is None
    assert store.finished([episode]) == {}
    warning = capsys.readouterr().err
    assert f"bad record {path}: {REASONS[kind]}" in warning
    assert warning.count(str(path)) == 1  # named once, however often it is read

    store.write(episode, record(episode))
    assert store.load(episode) == json.loads(path.read_text())
    (kept,) = (tmp_path / "quarantine" / "libero_spatial").glob("task00_init00.json.*[0-9]")
    assert kept.read_bytes() == content
    reason = kept.with_name(f"{kept.name}.reason").read_text()
    assert str(path) in reason and REASONS[kind] in reason
    assert f"set aside bad record {path} -> {kept}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == ["task00_init00.json"]


def test_a_good_or_errored_record_is_overwritten_in_place(tmp_path):
    store = EpisodeStore(tmp_path)
    episode = EPISODES[0]
    store.write(episode, record(episode, error="RuntimeError: env exploded"))
    store.write(episode, record(episode))
    assert list(store.finished([episode])) == [episode]
    assert not (tmp_path / "quarantine").exists()


WRITER = """
import sys
from pathlib import Path
from libero_eval.store import atomic_write_bytes
size = int(sys.argv[2])
i = 0
while True:
    atomic_write_bytes(Path(sys.argv[1]), (b"ab"[i % 2:i % 2 + 1]) * size)
    i += 1
    if i == 2:
        print("writing", flush=True)
"""


def test_killing_a_writer_never_leaves_a_partial_record(tmp_path):
    """SIGKILL at arbitrary moments of a stream of atomic rewrites: the file is always one
    complete version, never a mix or a truncated one."""
    target = tmp_path / "record.json"
    size = 4_000_000
    atomic_write_bytes(target, b"a" * size)
    for delay in (0.0, 0.013, 0.029, 0.047, 0.071):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), str(size)], stdout=subprocess.PIPE
        )
        assert writer.stdout.readline() == b"writing\n"  # two complete rewrites done
        time.sleep(delay)
        writer.kill()
        writer.wait()
        data = target.read_bytes()
        assert len(data) == size
        assert data in (b"a" * size, b"b" * size)


def test_a_failing_write_keeps_the_old_record_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    atomic_write_bytes(target, b"old")

    def disk_full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_full_disk_names_the_path_and_keeps_the_old_record(tmp_path, monkeypatch):
    """The kernel's own ENOSPC: the temporary file is /dev/full (every write to it fails so)."""
    store = EpisodeStore(tmp_path / "episodes")
    episode = EPISODES[0]
    path = store.write(episode, record(episode, error="RuntimeError: env exploded"))
    before = path.read_bytes()

    def on_dev_full(dir: Path, prefix: str, suffix: str) -> tuple[int, str]:
        return os.open("/dev/full", os.O_WRONLY), str(Path(dir) / f"{prefix}x{suffix}")

    monkeypatch.setattr("tempfile.mkstemp", on_dev_full)
    with pytest.raises(DiskFullError) as raised:
        store.write(episode, record(episode))
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC
    assert f"No space left on device: cannot write {path}." in str(raised.value)
    assert f"Free space on the disk that holds {path.parent}" in str(raised.value)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_shard_table_round_trips_with_the_result_schema(tmp_path):
    records = [record(ep) for ep in EPISODES]
    path = tmp_path / "shard000.parquet"
    write_results(records, path)
    assert pq.read_schema(path).names == RESULT_COLUMNS
    assert pq.read_table(path).schema.equals(RESULT_SCHEMA, check_metadata=False)
    frame = read_results([path])
    assert len(frame) == len(EPISODES)
    assert frame["first_success_step"].dtype == pd.Int32Dtype()
    assert frame["first_success_step"].isna().sum() == 2
    assert frame["task_id"].tolist() == [ep.task_id for ep in EPISODES]


def test_a_shard_table_rebuilt_from_the_store_equals_the_original(tmp_path):
    """Resume: records persisted in two sessions make the same table as one session's."""
    records = [record(ep) for ep in EPISODES]
    write_results(records, tmp_path / "uninterrupted.parquet")
    store = EpisodeStore(tmp_path / "store")
    for ep, row in zip(EPISODES[:2], records[:2], strict=True):  # first session, then killed
        store.write(ep, row)
    for ep, row in zip(EPISODES[2:], records[2:], strict=True):  # the rerun does the rest
        store.write(ep, row)
    assert list(store.finished(EPISODES)) == EPISODES
    write_results([store.load(ep) for ep in EPISODES], tmp_path / "resumed.parquet")
    pd.testing.assert_frame_equal(
        read_results([tmp_path / "resumed.parquet"]),
        read_results([tmp_path / "uninterrupted.parquet"]),
    )


def test_a_truncated_shard_table_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "shard003.parquet"
    write_results([record(ep) for ep in EPISODES], path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="shard003.parquet: not a readable Parquet") as error:
        read_results([path])
    assert "delete it and rerun" in str(error.value)


def test_a_shard_table_of_another_schema_names_the_missing_columns(tmp_path):
    path = tmp_path / "shard000.parquet"
    pd.DataFrame({"suite": ["libero_spatial"], "task_id": [0]}).to_parquet(path)
    with pytest.raises(ValueError, match=r"shard000.parquet: missing result columns \[") as error:
        read_results([path])
    assert "'success_once'" in str(error.value)


def test_fingerprint_ignores_key_order_and_tracks_every_value():
    settings = {"seed": 1, "policy": {"normalization": "quantile_rot", "seed": 1140}}
    reordered = {"policy": {"seed": 1140, "normalization": "quantile_rot"}, "seed": 1}
    assert fingerprint(settings) == fingerprint(reordered)
    changed = {"seed": 1, "policy": {"normalization": "quantile", "seed": 1140}}
    assert fingerprint(changed) != fingerprint(settings)
    assert len(fingerprint(settings)) == 12
    assert Path(fingerprint(settings)).name == fingerprint(settings)
