"""Which episode each env worker of a shard runs next, and the shard's episode counts.

Workers are numbered 0..W-1 and fall in G env groups (group g holds workers g, g+G, g+2G, ...;
a group's ready observations share one policy request). The scheduler knows nothing of
processes, HTTP or LIBERO: the shard runner tells it what happened and it answers which
episode comes next, so it is tested with plain episodes.

Assignment: a worker takes an episode of its own task first (no env rebuild), then one of the
tasks its group's other workers run (same prompt, so they share a batch), else the next in
plan order. An episode whose env worker died is started again until it has had
`max_attempts` attempts; after that the runner records it as failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
        groups: int = 1,
        done_before: int = 0,
        total: int | None = None,
        max_attempts: int = 2,
        progress: Callable[[int, int, int], None] | None = None,
    ):
        """`done_before` episodes of the shard's `total` were finished by an earlier run;
        `progress(done, total, successes)` is called after every finished episode (successes
        counts this run's only)."""
        self._todo = list(pending)
        self._running: dict[int, RunningEpisode] = {}
        self.groups = groups
        self.total = done_before + len(pending) if total is None else total
        self.max_attempts = max_attempts
        self.progress = progress
        self.done = done_before  # episodes of the shard finished, earlier runs included
        self.successes = 0  # successful episodes finished by this run
        self.finished_here = 0  # episodes finished (and recorded) by this run
        self.first_attempts = 0  # episodes this run has started for the first time

    def group_of(self, worker: int) -> int:
        return worker % self.groups

    @property
    def all_done(self) -> bool:
        """Every pending episode is finished: none left to hand out, none running."""
        return not self._todo and not self._running

    def is_running(self, worker: int) -> bool:
        return worker in self._running

    def running_on(self, worker: int) -> RunningEpisode:
        """The episode `worker` runs (KeyError when it runs none)."""
        return self._running[worker]

    def next_for(self, worker: int) -> Episode | None:
        """Take the next episode for `worker` off the to-do list (None when it is empty):
        its own task first, then its group's other tasks in worker order, else plan order."""
        if not self._todo:
            return None
        group = self.group_of(worker)
        wanted = [self._running[worker].episode] if worker in self._running else []
        wanted += [
            info.episode
            for index, info in self._running.items()
            if self.group_of(index) == group and index != worker
        ]
        for episode in wanted:
            for i, candidate in enumerate(self._todo):
                if (candidate.suite, candidate.task_id) == (episode.suite, episode.task_id):
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
        """`worker`'s env died: start its episode again if it has attempts left and return
        the new attempt, else None (the caller then fails the episode with `finish`)."""
        info = self._running[worker]
        if info.attempt >= self.max_attempts:
            return None
        return self.start(worker, info.episode, info.attempt + 1)

    def finish(self, worker: int, success: bool) -> Episode | None:
        """`worker`'s episode is over and recorded: count it, report progress, and take the
        worker's next episode off the to-do list (None: the worker stays idle)."""
        self.finished_here += 1
        self.done += 1
        self.successes += int(success)
        if self.progress:
            self.progress(self.done, self.total, self.successes)
        following = self.next_for(worker)
        del self._running[worker]
        return following
