"""The shard's episode scheduler alone: which worker runs what, retries, counts, progress."""

from libero_eval.failures import FailurePolicy
from libero_eval.plan import Episode
from libero_eval.rollout.scheduler import EpisodeScheduler

# plan order interleaves tasks: task 0, task 1, task 0, task 1, task 2, task 2
PENDING = [
    Episode("libero_goal", 0, 0),
    Episode("libero_goal", 1, 0),
    Episode("libero_goal", 0, 1),
    Episode("libero_goal", 1, 1),
    Episode("libero_goal", 2, 0),
    Episode("libero_goal", 2, 1),
]


def run(scheduler: EpisodeScheduler, workers: int, finishing: list[int]) -> list[tuple]:
    """Start every worker, then finish the episodes of `finishing` in turn (each worker
    starts its next one at once); return (worker, episode) in the order they were started."""
    started = []
    for worker in range(workers):
        episode = scheduler.next_for(worker)
        scheduler.start(worker, episode)
        started.append((worker, episode))
    for worker in finishing:
        following = scheduler.finish(worker, success=True)
        if following is not None:
            scheduler.start(worker, following)
            started.append((worker, following))
    return started


def test_each_episode_goes_out_once_own_task_first_then_a_partial_batch_then_plan_order():
    scheduler = EpisodeScheduler(PENDING, batch_size=2)
    started = run(scheduler, workers=2, finishing=[1, 0, 0, 1, 0, 1])
    goal = "libero_goal"
    assert started == [
        (0, Episode(goal, 0, 0)),  # plan order
        (1, Episode(goal, 0, 1)),  # the task worker 0 runs alone: one prompt, one batch
        (1, Episode(goal, 1, 0)),  # task 0 is used up: plan order
        (0, Episode(goal, 1, 1)),  # worker 1's task
        (0, Episode(goal, 2, 0)),  # plan order
        (1, Episode(goal, 2, 1)),  # worker 0's task
    ]
    assert sorted(episode for _, episode in started) == sorted(PENDING)
    assert scheduler.all_done
    assert scheduler.next_for(0) is None


def test_with_batches_of_one_a_worker_keeps_its_own_task_and_joins_no_other():
    scheduler = EpisodeScheduler(PENDING, batch_size=1)
    started = run(scheduler, workers=2, finishing=[1, 0, 0, 1, 0, 1])
    goal = "libero_goal"
    assert started == [
        (0, Episode(goal, 0, 0)),
        (1, Episode(goal, 1, 0)),  # a batch of one is full: plan order, not worker 0's task
        (1, Episode(goal, 1, 1)),  # its own task before plan order (no env rebuild)
        (0, Episode(goal, 0, 1)),
        (0, Episode(goal, 2, 0)),
        (1, Episode(goal, 2, 1)),  # plan order (task 2 already has its one env)
    ]
    assert scheduler.all_done


def test_an_episode_whose_worker_died_is_retried_once_then_fails():
    progress = []
    scheduler = EpisodeScheduler(
        PENDING[:2],
        failures=FailurePolicy.defaults(episode_attempts=2),
        progress=lambda *args: progress.append(args),
    )
    first = scheduler.start(0, scheduler.next_for(0))
    retry = scheduler.retry(0)
    assert retry is not None and retry.episode == first.episode and retry.attempt == 2
    assert scheduler.running_on(0) is retry
    assert scheduler.first_attempts == 1  # the retry is no new episode
    assert scheduler.retry(0) is None  # died again: out of attempts, the caller fails it
    assert scheduler.running_on(0) is retry  # still the worker's until it is finished
    following = scheduler.finish(0, success=False)
    assert progress == [(1, 2, 0)]
    assert following == PENDING[1]
    assert scheduler.start(0, following).attempt == 1
    assert scheduler.first_attempts == 2


def test_counts_and_progress_include_earlier_runs_and_done_means_nothing_left():
    progress = []
    scheduler = EpisodeScheduler(
        PENDING[3:],
        done_before=3,
        total=6,
        progress=lambda *args: progress.append(args),
    )
    assert not scheduler.all_done  # nothing started yet
    for worker in (0, 1):
        scheduler.start(worker, scheduler.next_for(worker))
    following = scheduler.finish(1, success=True)
    assert not scheduler.all_done and not scheduler.is_running(1)
    scheduler.start(1, following)
    assert scheduler.finish(0, success=False) is None
    assert not scheduler.all_done  # worker 1 still runs
    assert scheduler.finish(1, success=True) is None
    assert scheduler.all_done
    # (done, total, successes): done counts the earlier run's 3, successes this run's only
    assert progress == [(4, 6, 1), (5, 6, 1), (6, 6, 2)]
    assert (scheduler.done, scheduler.successes, scheduler.finished_here) == (6, 2, 3)
    assert scheduler.first_attempts == 3


def interleaved(tasks: int, trials: int) -> list[Episode]:
    """The plan's order: task 0 trial 0, task 1 trial 0, ..., task 0 trial 1, ..."""
    return [Episode("libero_spatial", t, i) for i in range(trials) for t in range(tasks)]


def test_workers_are_packed_onto_tasks_a_full_batch_at_a_time():
    # 16 envs, batches of 8, two tasks: each task's 8 envs make one full same-prompt batch
    scheduler = EpisodeScheduler(interleaved(2, 16), batch_size=8)
    tasks = [scheduler.start(w, scheduler.next_for(w)).episode.task_id for w in range(16)]
    assert tasks == [0] * 8 + [1] * 8
    # a finishing env stays on its task (no env rebuild), so the batches stay full
    for worker in range(16):
        following = scheduler.finish(worker, success=True)
        assert following.task_id == tasks[worker]
        scheduler.start(worker, following)


def test_envs_leaving_a_used_up_task_gather_on_one_new_task():
    # the shipped plan's mix: 10 tasks x 8 trials, 16 envs, batches of 8
    scheduler = EpisodeScheduler(interleaved(10, 8), batch_size=8)
    for worker in range(16):
        scheduler.start(worker, scheduler.next_for(worker))
    # task 0's envs (0-7) finish one after the other: the first opens task 2, the others
    # join it (the fullest task below a full batch) rather than each opening its own
    following = []
    for worker in range(8):
        following.append(scheduler.finish(worker, success=True))
        scheduler.start(worker, following[-1])  # as the runner does, at once
    assert [e.task_id for e in following] == [2] * 8
    assert sorted(e.init_state_id for e in following) == list(range(8))


def test_a_partial_task_below_a_full_batch_draws_the_fullest_first():
    episodes = interleaved(3, 4)  # tasks 0, 1, 2 with 4 trials each
    scheduler = EpisodeScheduler(episodes, batch_size=4)
    # task 0 on workers 0-2 (3 envs), task 1 on worker 3 (1 env)
    for worker, episode in enumerate([episodes[0], episodes[3], episodes[6], episodes[1]]):
        scheduler._todo.remove(episode)
        scheduler.start(worker, episode)
    assert scheduler.next_for(4) == Episode("libero_spatial", 0, 3)  # task 0 reaches 4
    scheduler.start(4, Episode("libero_spatial", 0, 3))
    assert scheduler.next_for(5).task_id == 1  # task 0 is full: task 1 grows next
