"""Which episode each env worker of a shard runs next, and the shard's episode counts.

Workers are numbered 0..W-1. A policy request carries one prompt, so envs that run the same
task share a batch: the scheduler packs workers onto tasks `batch_size` at a time (the
server's max batch per request). It knows nothing of processes, HTTP or LIBERO: the shard
runner tells it what happened and it answers which episode comes next, so it is tested with
plain episodes. Which episode runs where changes no outcome: an episode's scene is seeded from
the episode alone.

Assignment: a worker takes an episode of its own task first (no env rebuild); else one of a
task that other workers run on fewer than `batch_size` envs, the fullest first (its batch
grows towards full); else the next in plan order. With `batch_size` 1 (a server that merges
single-observation requests itself) that is own task, then plan order. An episode whose env
worker died is started again until it has had `max_attempts` attempts; after that the runner
records it as failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libero_eval.failures import Action, FailureKind, FailurePolicy
from libero_eval.plan import Episode


@dataclass
class RunningEpisode:
    """The episode a worker is running, with what its result row collects on the way."""

    episode: Episode
    started: float  # time.perf_counter() when this attempt started
    attempt: int = 1
    latencies: list[float] = field(default_factory=list)
    task_language: str = ""


class EpisodeScheduler:
    """Hands a shard's pending episodes to its workers and counts the finished ones."""

    def __init__(
        self,
        pending: Sequence[Episode],
        batch_size: int = 1,
        done_before: int = 0,
        total: int | None = None,
        failures: FailurePolicy | None = None,
        progress: Callable[[int, int, int], None] | None = None,
    ):
        """`done_before` episodes of the shard's `total` were finished by an earlier run;
        `progress(done, total, successes)` is called after every finished episode (successes
        counts this run's only); `failures`: decides whether a dead worker's episode is
        retried (None: the schema's defaults)."""
        self._todo = list(pending)
        self._running: dict[int, RunningEpisode] = {}
        self.batch_size = batch_size
        self.total = done_before + len(pending) if total is None else total
        self.failures = failures or FailurePolicy.defaults()
        self.progress = progress
        self.done = done_before  # episodes of the shard finished, earlier runs included
        self.successes = 0  # successful episodes finished by this run
        self.finished_here = 0  # episodes finished (and recorded) by this run
        self.first_attempts = 0  # episodes this run has started for the first time

    @property
    def all_done(self) -> bool:
        """Every pending episode is finished: none left to hand out, none running."""
        return not self._todo and not self._running

    @property
    def to_start(self) -> int:
        """Episodes not handed to a worker yet."""
        return len(self._todo)

    def is_running(self, worker: int) -> bool:
        return worker in self._running

    def running_on(self, worker: int) -> RunningEpisode:
        """The episode `worker` runs (KeyError when it runs none)."""
        return self._running[worker]

    def next_for(self, worker: int) -> Episode | None:
        """Take the next episode for `worker` off the to-do list (None when it is empty):
        its own task first, then a task other workers run on fewer than `batch_size` envs
        (the most first), else plan order."""
        if not self._todo:
            return None
        own = self._running.get(worker)
        running_on: dict[tuple[str, int], int] = {}
        for index, info in self._running.items():
            if index != worker:
                task = (info.episode.suite, info.episode.task_id)
                running_on[task] = running_on.get(task, 0) + 1
        wanted = [(own.episode.suite, own.episode.task_id)] if own is not None else []
        wanted += sorted(
            (task for task, count in running_on.items() if count < self.batch_size),
            key=lambda task: -running_on[task],
        )
        for task in wanted:
            for i, candidate in enumerate(self._todo):
                if (candidate.suite, candidate.task_id) == task:
                    return self._todo.pop(i)
        return self._todo.pop(0)

    def start(self, worker: int, episode: Episode, attempt: int = 1) -> RunningEpisode:
        """`worker` starts `episode` (attempt 1 counts in `first_attempts`)."""
        running = RunningEpisode(episode, time.perf_counter(), attempt)
        self._running[worker] = running
        if attempt == 1:
            self.first_attempts += 1
        return running

    def retry(self, worker: int) -> RunningEpisode | None:
        """`worker`'s env died: start its episode again if the failure policy says so and
        return the new attempt, else None (the caller then fails the episode with `finish`)."""
        info = self._running[worker]
        if self.failures.decide(FailureKind.ENV_DIED, info.attempt) is not Action.RETRY_EPISODE:
            return None
        return self.start(worker, info.episode, info.attempt + 1)

    def finish(self, worker: int, success: bool, take_next: bool = True) -> Episode | None:
        """`worker`'s episode is over and recorded: count it, report progress, and take the
        worker's next episode off the to-do list (None: the worker stays idle; always with
        `take_next` False, a worker the shard closes)."""
        self.finished_here += 1
        self.done += 1
        self.successes += int(success)
        if self.progress:
            self.progress(self.done, self.total, self.successes)
        following = self.next_for(worker) if take_next else None
        del self._running[worker]
        return following
