"""Each named episode protocol, exactly as its reference (docs/protocols.md cites the lines).

A scripted stand-in for the LIBERO env records every reset and step, so these tests can count
the settle steps, policy steps, actions per query, stops and the seed of every reset stream.
The real-LIBERO side of seeding is in tests/test_episode_determinism.py.
"""

import numpy as np
import pytest

from libero_eval.config import ConfigError, check_config
from libero_eval.plan import Episode
from libero_eval.rollout.libero_env import (
    SETTLE_ACTION,
    EnvSettings,
    EpisodeOutcome,
    EpisodeSpec,
    LiberoEpisodeEnv,
)
from libero_eval.rollout.protocols import episode_seed, get_protocol, reset_seed_of
from libero_eval.rollout.records import episode_record
from libero_eval.rollout.shard_settings import ShardSettings
from libero_eval.settings_schema import build, default

CHUNK = 16


class ScriptedLibero:
    """Stands in for LIBERO's OffScreenRenderEnv: succeeds on the env steps listed in
    `success_steps` (counted from the reset, settle steps included); every reset draws from
    numpy's global stream, as LIBERO's fixture placement does."""

    def __init__(self, success_steps=()):
        self.success_steps = set(success_steps)
        self.reset_draws: list[float] = []
        self.actions: list[np.ndarray] = []
        self.steps_since_reset = 0

    def reset(self):
        self.reset_draws.append(float(np.random.random()))
        self.actions = []
        self.steps_since_reset = 0

    def _obs(self):
        image = np.zeros((4, 4, 3), dtype=np.uint8)
        return {"agentview_image": image, "robot0_eye_in_hand_image": image}

    def set_init_state(self, state):
        return self._obs()

    def step(self, action):
        self.actions.append(np.asarray(action))
        self.steps_since_reset += 1
        return self._obs(), 0.0, self.steps_since_reset in self.success_steps, {}

    def close(self):
        pass


class ScriptedEpisodeEnv(LiberoEpisodeEnv):
    """LiberoEpisodeEnv with the scripted env in place of LIBERO (everything else is ours)."""

    def __init__(self, protocol, success_steps=(), reset_seeding="episode"):
        super().__init__(build(EnvSettings, "rollout", reset_seeding=reset_seeding), protocol)
        self.fake = ScriptedLibero(success_steps)
        self.queries = 0

    def _load(self, suite, task_id):
        self._env, self.task_language = self.fake, "a task"
        self._init_states = np.zeros((50, 1))
        self._task = (suite, task_id)


def run_episode(env: ScriptedEpisodeEnv, suite="libero_spatial", task_id=0, init_state_id=0):
    """Drive one episode with chunks of CHUNK distinct actions; the outcome."""
    env.start_episode(EpisodeSpec(suite, task_id, init_state_id))
    while True:
        env.queries += 1
        chunk = np.zeros((CHUNK, 7))
        chunk[:, 0] = np.arange(CHUNK)  # action k of a chunk has dx = k
        result = env.step_chunk(chunk)
        if isinstance(result, EpisodeOutcome):
            return result


def settle_and_policy_actions(env: ScriptedEpisodeEnv, settle: int):
    actions = env.fake.actions
    assert all(np.array_equal(a, SETTLE_ACTION) for a in actions[:settle])
    return actions[settle:]


# ------------------------------------------------------------------------------ rlinf


def test_rlinf_runs_15_uncounted_settle_steps_then_480_policy_steps_without_stopping():
    env = ScriptedEpisodeEnv(get_protocol("rlinf"), success_steps={115, 116})
    outcome = run_episode(env)
    policy = settle_and_policy_actions(env, 15)
    assert len(env.fake.actions) == 15 + 480 and len(policy) == 480
    assert env.queries == 480 // CHUNK
    assert outcome.steps == 480  # the settle steps are not counted
    assert outcome.success_once and not outcome.success_at_end
    assert outcome.first_success_step == 100  # policy step 100 = env step 115


def test_rlinf_runs_whole_chunks_past_a_limit_that_is_not_a_multiple():
    # libero_10: 520 steps; RLinf checks the limit between chunks: 33 chunks = 528 steps.
    env = ScriptedEpisodeEnv(get_protocol("rlinf"), success_steps={15 + 528})
    outcome = run_episode(env, suite="libero_10")
    assert len(env.fake.actions) == 15 + 528 and outcome.steps == 528
    assert outcome.success_at_end  # success_at_end is the last executed step's flag


@pytest.mark.parametrize(
    ("suite", "limit"),
    [
        ("libero_spatial", 480),
        ("libero_object", 512),
        ("libero_goal", 512),
        ("libero_10", 520),
        ("libero_90", 512),
    ],
)
def test_rlinf_step_limits_per_suite(suite, limit):
    assert get_protocol("rlinf").max_steps_for(suite) == limit


# ------------------------------------------------------------------------------ cosmos


def test_cosmos_counts_its_10_wait_steps_inside_the_limit():
    env = ScriptedEpisodeEnv(get_protocol("cosmos"))
    outcome = run_episode(env)
    policy = settle_and_policy_actions(env, 10)
    assert len(env.fake.actions) == 220 and len(policy) == 210
    assert outcome.steps == 220 and not outcome.success_once
    # whole chunks: 13 full chunks and the first 2 actions of the 14th
    assert env.queries == 14
    assert [a[0] for a in policy[-3:]] == [15, 0, 1]


def test_cosmos_stops_at_the_first_success_and_reports_the_counted_step():
    env = ScriptedEpisodeEnv(get_protocol("cosmos"), success_steps={50})
    outcome = run_episode(env)
    assert len(env.fake.actions) == 50
    assert outcome.success_once and outcome.success_at_end
    assert outcome.steps == 50 and outcome.first_success_step == 50


# ------------------------------------------------------------------------------ openpi


def test_openpi_waits_10_steps_on_top_of_220_and_replans_every_5_actions():
    env = ScriptedEpisodeEnv(get_protocol("openpi"))
    outcome = run_episode(env)
    policy = settle_and_policy_actions(env, 10)
    assert len(policy) == 220 and len(env.fake.actions) == 230
    assert env.queries == 220 // 5
    assert [a[0] for a in policy[:10]] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert outcome.steps == 230 and not outcome.success_once


def test_openpi_stops_at_success():
    env = ScriptedEpisodeEnv(get_protocol("openpi"), success_steps={10 + 37})
    outcome = run_episode(env)
    assert len(env.fake.actions) == 47 and outcome.success_once and outcome.steps == 47


@pytest.mark.parametrize(
    ("name", "limits"),
    [
        ("cosmos", [220, 280, 300, 520, 400]),
        ("openpi", [220, 280, 300, 520, 400]),
    ],
)
def test_reference_step_limits_per_suite(name, limits):
    suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]
    assert [get_protocol(name).max_steps_for(s) for s in suites] == limits


# ------------------------------------------------------------------------------ seeds


@pytest.mark.parametrize(("name", "seed"), [("rlinf", 0), ("cosmos", 0), ("openpi", 7)])
def test_each_protocol_seeds_every_reset_from_the_episode_alone(name, seed):
    protocol = get_protocol(name, max_steps_override=32)
    assert protocol.seed == seed
    env = ScriptedEpisodeEnv(protocol)
    order = [(0, 3), (1, 0), (0, 1), (0, 3)]
    for task_id, init_state_id in order:
        run_episode(env, task_id=task_id, init_state_id=init_state_id)
    expected = []
    for task_id, init_state_id in order:
        np.random.seed(episode_seed(seed, "libero_spatial", task_id, init_state_id))
        expected.append(float(np.random.random()))
    assert env.fake.reset_draws == expected
    assert env.fake.reset_draws[0] == env.fake.reset_draws[3]  # 1st and 4th: same episode
    assert len(set(env.fake.reset_draws[:3])) == 3


def test_episode_seeds_differ_per_suite_task_init_state_and_seed():
    seeds = {
        episode_seed(s, suite, t, i)
        for s in (0, 7)
        for suite in ("libero_spatial", "libero_goal")
        for t in range(3)
        for i in range(3)
    }
    assert len(seeds) == 2 * 2 * 3 * 3
    assert episode_seed(7, "libero_spatial", 2, 5) == episode_seed(7, "libero_spatial", 2, 5)


@pytest.mark.parametrize("name", ["openpi", "cosmos"])
def test_reference_seeding_replays_a_task_seeded_once_with_trials_in_order(name):
    protocol = get_protocol(name, max_steps_override=32)
    # The reference: seed once per task, then trials 0, 1, 2, 3 in order.
    np.random.seed(protocol.seed)
    sequential = [float(np.random.random()) for _ in range(4)]

    env = ScriptedEpisodeEnv(protocol, reset_seeding="reference")
    for init_state_id in (3, 1, 2, 0):
        env.fake.reset_draws.clear()
        run_episode(env, init_state_id=init_state_id)
        # the last reset is the episode's; the ones before it replay earlier trials
        assert env.fake.reset_draws[-1] == sequential[init_state_id]
    assert reset_seed_of(protocol, "reference", "libero_spatial", 0, 3) == protocol.seed


def test_reference_seeding_is_refused_for_rlinf(default_config):
    default_config["rollout"]["reset_seeding"] = "reference"
    with pytest.raises(ConfigError, match=r"rollout.reset_seeding: reference .* rlinf"):
        check_config(default_config)


def test_plan_seed_replaces_the_protocol_seed():
    assert get_protocol("openpi", seed=3).seed == 3
    assert get_protocol("openpi").seed == 7


def test_result_row_records_the_protocol_seed_and_the_episodes_reset_seed():
    protocol = get_protocol("openpi")
    settings = ShardSettings(
        run_id="r",
        shard="shard000",
        slot=0,
        protocol=protocol,
        env=build(EnvSettings, "rollout"),
        adapter=None,  # a result row does not ask the policy
        envs_per_shard=1,
        total_num_envs=None,
        max_inflight_requests=None,
        merged_dispatch="batches",
        batch_timeout_s=default("rollout", "batch_timeout_s"),
        health_timeout_s=default("server", "health_timeout_s"),
    )
    row = episode_record(settings, Episode("libero_goal", 4, 9), None, None)
    assert row["seed"] == 7 and row["reset_seeding"] == "episode"
    assert row["episode_seed"] == episode_seed(7, "libero_goal", 4, 9)


def test_a_perturbed_episode_takes_its_clean_pairs_seed_and_an_unpaired_one_its_own():
    protocol = get_protocol("openpi")
    clean = reset_seed_of(protocol, "episode", "libero_spatial", 3, 5)
    assert reset_seed_of(protocol, "episode", "libero_spatial_swap", 3, 5) == clean
    # a `_task` suite asks for another task in the same scene: not a pair, its own seed
    assert reset_seed_of(protocol, "episode", "libero_spatial_task", 3, 5) == episode_seed(
        7, "libero_spatial_task", 3, 5
    )


# ------------------------------------------------------------------------------ lerobot


def test_lerobot_waits_10_uncounted_steps_then_280_and_executes_10_actions_a_query():
    """lerobot-eval: 10 waits inside LiberoEnv.reset (not counted), the suite's limit (280 on
    spatial), n_action_steps 10 of each chunk, stop at success."""
    env = ScriptedEpisodeEnv(get_protocol("lerobot"))
    outcome = run_episode(env)
    policy = settle_and_policy_actions(env, 10)
    assert len(policy) == 280 and len(env.fake.actions) == 290
    assert env.queries == 28
    assert outcome.steps == 280 and not outcome.success_once
    stopped = ScriptedEpisodeEnv(get_protocol("lerobot"), success_steps={10 + 37})
    assert run_episode(stopped).steps == 37


def test_lerobot_step_limits_and_seed_per_trial():
    protocol = get_protocol("lerobot")
    suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]
    assert [protocol.max_steps_for(s) for s in suites] == [280, 280, 300, 520, 400]
    assert protocol.seed == 1000
    # lerobot-eval: reset(seed=start_seed + episode index), episode i of a task at init state i
    env = ScriptedEpisodeEnv(
        get_protocol("lerobot", max_steps_override=32), reset_seeding="reference"
    )
    for init_state_id in (3, 0, 3):
        env.fake.reset_draws.clear()
        run_episode(env, task_id=2, init_state_id=init_state_id)
        np.random.seed(1000 + init_state_id)
        assert env.fake.reset_draws == [float(np.random.random())]  # one reset, no replay
    assert reset_seed_of(protocol, "reference", "libero_goal", 5, 7) == 1007
