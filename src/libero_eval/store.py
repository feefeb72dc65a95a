"""The result store: one durable record per finished episode, and the shard Parquet tables.

Episode records live OUTSIDE the workflow's declared outputs
(`results/<run>/episodes/<fingerprint>/<suite>/taskTT_initII.json`), so a failing job never
deletes them; the fingerprint covers every setting that changes an episode's outcome, so a
changed policy or env parameter never reuses a stale record. Each record is written to a
temporary file, fsynced and renamed: a crash leaves either the old state or the new record.

A record that cannot stand for its episode (not JSON, not an object, a missing or wrongly typed
column, or another episode's record) is never used: a warning names its path, its episode is
rerun, and before the rerun's record takes its place it is moved, with the reason beside it,
into `quarantine/` under the store (never deleted).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from libero_eval.plan import Episode
from libero_eval.suites import base_suite

# pandas where results are read or written as frames: the rollout fingerprint and the
# episode store's records need none, and Snakemake imports this module at parse time.
if TYPE_CHECKING:
    import pandas as pd

RESULT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("suite", pa.string(), nullable=False),
        pa.field("base_suite", pa.string()),  # the clean LIBERO suite a perturbation varies
        pa.field("task_id", pa.int32(), nullable=False),
        pa.field("task_language", pa.string()),
        pa.field("init_state_id", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("reset_seeding", pa.string(), nullable=False),
        pa.field("episode_seed", pa.int64(), nullable=False),
        pa.field("protocol", pa.string(), nullable=False),
        pa.field("success_once", pa.bool_(), nullable=False),
        pa.field("success_at_end", pa.bool_(), nullable=False),
        pa.field("first_success_step", pa.int32()),
        pa.field("steps", pa.int32(), nullable=False),
        pa.field("policy_calls", pa.int32(), nullable=False),
        pa.field("policy_latency_mean_s", pa.float64()),
        pa.field("policy_latency_p50_s", pa.float64()),
        pa.field("policy_latency_p95_s", pa.float64()),
        pa.field("wall_time_s", pa.float64(), nullable=False),
        pa.field("server_slot", pa.int32(), nullable=False),
        pa.field("server_url", pa.string()),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("finished_at", pa.float64(), nullable=False),
        pa.field("video_path", pa.string()),
        pa.field("error", pa.string()),
    ]
)
RESULT_COLUMNS = RESULT_SCHEMA.names
QUARANTINE = "quarantine"  # bad records moved aside, under the store (EpisodeStore.set_aside)


def fingerprint(settings: dict[str, Any]) -> str:
    """A short stable hash of every setting that changes an episode's outcome."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


class DiskFullError(OSError):
    """No space (or quota) left where a record or table is written; names the path and fix."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the complete new one.
    A full disk (ENOSPC, or EDQUOT) raises :class:`DiskFullError` naming `path`."""
    path = Path(path)
    try:
        _write_and_rename(path, data)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFullError(
            exc.errno,
            f"{os.strerror(exc.errno)}: cannot write {path}. Free space on the disk that holds "
            f"{path.parent} (df -h {path.parent}), then rerun the workflow: what was written "
            "before is intact and reused",
        ) from exc


def _write_and_rename(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class EpisodeStore:
    """Durable per-episode records under one fingerprint directory."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._warned: set[Path] = set()  # bad records named once per store object

    def path_for(self, episode: Episode) -> Path:
        """`<suite>/taskTT_initII.json`; `taskTT_initII_seedS.json` for an episode of a run
        with several seeds (`Episode.seed`)."""
        name = f"task{episode.task_id:02d}_init{episode.init_state_id:02d}"
        if episode.seed is not None:
            name += f"_seed{episode.seed}"
        return self.root / episode.suite / f"{name}.json"

    def _path_to_load(self, episode: Episode) -> Path:
        """Where `episode`'s record is: its own path, or, for a seeded episode not stored under
        it, the single-seed path when the record there ran under that seed (a run that had one
        seed and now lists more reuses the episodes it already ran)."""
        path = self.path_for(episode)
        if episode.seed is None or path.exists():
            return path
        single = self.path_for(Episode(episode.suite, episode.task_id, episode.init_state_id))
        try:
            stored_seed = json.loads(single.read_text()).get("seed")
        except (OSError, ValueError, AttributeError):
            return path
        return single if stored_seed == episode.seed else path

    def write(self, episode: Episode, record: dict[str, Any]) -> Path:
        """Store the episode's record; a bad record in its place is set aside first."""
        path = self.path_for(episode)
        if path.exists():
            _, problem = self._read(path, episode)
            if problem is not None:
                self.set_aside(path, problem)
        atomic_write_bytes(path, json.dumps(record, sort_keys=True).encode())
        return path

    def load(self, episode: Episode) -> dict[str, Any] | None:
        """The episode's record, or None if absent or bad (then it is rerun)."""
        path = self._path_to_load(episode)
        record, problem = self._read(path, episode)
        if problem is not None and path not in self._warned:
            self._warned.add(path)
            print(
                f"[store] bad record {path}: {problem}. Its episode is rerun; the record is "
                f"then moved to {self.root / QUARANTINE}/ (never deleted).",
                file=sys.stderr,
            )
        return record

    def _read(self, path: Path, episode: Episode) -> tuple[dict[str, Any] | None, str | None]:
        """(the record, None), (None, what is wrong with it), or (None, None) if absent."""
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as exc:
            return None, f"unreadable ({exc})"
        problem = record_problem(record, episode)
        return (None, problem) if problem else (with_derived_columns(record), None)

    def set_aside(self, path: Path, problem: str) -> Path:
        """Move a bad record to `quarantine/<suite>/<name>.<time>` under the store (no longer
        `*.json`, so nothing that globs records takes it for one), with the reason beside it
        in `<that name>.reason`; returns where it went."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        relative = path.relative_to(self.root)
        target = self.root / QUARANTINE / relative.parent / f"{path.name}.{stamp}"
        reason = f"{path}\n{problem}\nset aside {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        atomic_write_bytes(target.with_name(f"{target.name}.reason"), reason.encode())
        os.replace(path, target)
        print(f"[store] set aside bad record {path} -> {target} ({problem})", file=sys.stderr)
        return target

    def finished(self, episodes: Iterable[Episode]) -> dict[Episode, dict[str, Any]]:
        """Records of episodes that finished without error (errored ones are rerun)."""
        done = {}
        for episode in episodes:
            record = self.load(episode)
            if record is not None and record.get("error") is None:
                done[episode] = record
        return done


def record_problem(record: Any, episode: Episode) -> str | None:
    """What keeps a stored record from being `episode`'s result row, or None: it must be a
    JSON object with every column of RESULT_SCHEMA, each of its type (null only where the
    schema allows it), and name this episode (a record copied over another's file does not)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__ if record is not None else 'null'}"
    record = with_derived_columns(record)
    missing = sorted(set(RESULT_COLUMNS) - record.keys())
    if missing:
        return f"missing {', '.join(missing)}"
    for field in RESULT_SCHEMA:
        value = record[field.name]
        if value is None:
            if not field.nullable:
                return f"{field.name} is null"
            continue
        if pa.types.is_integer(field.type):
            fits = isinstance(value, int) and not isinstance(value, bool)
        elif pa.types.is_boolean(field.type):
            fits = isinstance(value, bool)
        elif pa.types.is_floating(field.type):
            fits = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            fits = isinstance(value, str)
        if not fits:
            return f"{field.name} is {value!r}, not of type {field.type}"
    try:
        records_to_table([record])
    except (pa.ArrowException, OverflowError) as exc:
        return f"not a result row ({exc})"
    stored = (record["suite"], record["task_id"], record["init_state_id"])
    if stored != (episode.suite, episode.task_id, episode.init_state_id):
        return (
            f"the record of {stored[0]} task {stored[1]} init state {stored[2]}, not of "
            f"{episode.suite} task {episode.task_id} init state {episode.init_state_id}"
        )
    if episode.seed is not None and record["seed"] != episode.seed:
        return f"the record of seed {record['seed']}, not of seed {episode.seed}"
    return None


def with_derived_columns(record: dict[str, Any]) -> dict[str, Any]:
    """Fill columns newer than a stored record that follow from its other fields."""
    if "base_suite" not in record and "suite" in record:
        record = {**record, "base_suite": base_suite(record["suite"])}
    return record


def records_to_table(records: Sequence[dict[str, Any]]) -> pa.Table:
    rows = [with_derived_columns(r) for r in records]
    return pa.Table.from_pylist(
        [{c: r.get(c) for c in RESULT_COLUMNS} for r in rows], RESULT_SCHEMA
    )


def write_results(records: Sequence[dict[str, Any]], path: Path | str) -> None:
    """Write episode records as one Parquet table (atomically)."""
    sink = pa.BufferOutputStream()
    pq.write_table(records_to_table(records), sink)
    atomic_write_bytes(Path(path), sink.getvalue().to_pybytes())


def read_results(paths: Iterable[Path | str]) -> pd.DataFrame:
    """Concatenate shard tables, checking each against the schema with a clear error."""
    import pandas as pd

    frames = []
    for path in paths:
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(
                f"{path}: not a readable Parquet file ({exc}). It was probably truncated by a "
                "crash; delete it and rerun the workflow: the shard is rebuilt from the episode "
                "store without rerunning finished episodes."
            ) from exc
        if "base_suite" not in table.column_names and "suite" in table.column_names:
            suites = table.column("suite").to_pylist()
            table = table.append_column(
                "base_suite", pa.array([base_suite(s) for s in suites], pa.string())
            )
        missing = set(RESULT_COLUMNS) - set(table.column_names)
        if missing:
            raise ValueError(
                f"{path}: missing result columns {sorted(missing)}; it was written by another "
                "version. Delete it and rerun the workflow."
            )
        frames.append(_to_pandas(table.select(RESULT_COLUMNS).cast(RESULT_SCHEMA)))
    if not frames:
        return _to_pandas(records_to_table([]))
    return pd.concat(frames, ignore_index=True)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Nullable integer columns stay integers (first_success_step may be null)."""
    import pandas as pd

    nullable = {
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
    }
    return table.to_pandas(types_mapper=nullable.get)


def write_frame(frame: pd.DataFrame, path: Path | str) -> None:
    """Write a results DataFrame (from read_results) with the result schema, atomically."""
    table = pa.Table.from_pandas(frame[RESULT_COLUMNS], schema=RESULT_SCHEMA, preserve_index=False)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(Path(path), sink.getvalue().to_pybytes())
