"""The result store: one durable record per finished episode, and the shard Parquet tables.

Episode records live OUTSIDE the workflow's declared outputs
(`results/<run>/episodes/<fingerprint>/<suite>/taskTT_initII.json`), so a failing job never
deletes them; the fingerprint covers every setting that changes an episode's outcome, so a
changed policy or env parameter never reuses a stale record. Each record is written to a
temporary file, fsynced and renamed: a crash leaves either the old state or the new record.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
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


def fingerprint(settings: dict[str, Any]) -> str:
    """A short stable hash of every setting that changes an episode's outcome."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the complete new one."""
    path = Path(path)
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
        path = self.path_for(episode)
        atomic_write_bytes(path, json.dumps(record, sort_keys=True).encode())
        return path

    def load(self, episode: Episode) -> dict[str, Any] | None:
        """The episode's record, or None if absent or unreadable (then it is rerun)."""
        path = self._path_to_load(episode)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            print(
                f"[store] ignoring unreadable record {path} ({exc}); rerunning it", file=sys.stderr
            )
            return None
        record = with_derived_columns(record)
        missing = set(RESULT_COLUMNS) - record.keys()
        if missing:
            print(f"[store] ignoring record {path} missing {sorted(missing)}", file=sys.stderr)
            return None
        return record

    def finished(self, episodes: Iterable[Episode]) -> dict[Episode, dict[str, Any]]:
        """Records of episodes that finished without error (errored ones are rerun)."""
        done = {}
        for episode in episodes:
            record = self.load(episode)
            if record is not None and record.get("error") is None:
                done[episode] = record
        return done


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
