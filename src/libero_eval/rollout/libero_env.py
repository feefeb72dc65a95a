"""One LIBERO env, in process: reset to an init state as the episode protocol seeds it, run the
protocol's settle steps and the policy's action chunks, render only on demand
(`libero_eval.rollout.render_on_demand`), and report the episode's outcome.
`libero_eval.rollout.env_worker` runs one in a child process; tests and benchmarks use it
directly.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from libero_eval.policy.adapter import Observation
from libero_eval.rollout import single_forward
from libero_eval.rollout.protocols import EpisodeProtocol, reset_seed_of
from libero_eval.rollout.render_on_demand import (
    LazyCameraSensor,
    RenderSwitch,
    install_lazy_cameras,
)
from libero_eval.suites import instruction

# what π0.5's 8-D state is built from (openpi examples/libero/main.py)
PROPRIO_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")
SETTLE_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])


@dataclass
class EnvSettings:
    """How envs are built and rendered: the `rollout` section's env part, whose fields take no
    default here (the config, filled by the schema, gives them; `settings_schema.build`)."""

    camera_size: int
    render_mode: str  # "on_demand" or "every_step" (what every peer does)
    send_privileged_state: bool
    reset_seeding: str  # "episode" or "reference" (libero_eval.rollout.protocols)
    reset_mode: str  # "fast" or "hard" (LIBERO's own; libero_eval.rollout.fast_reset)
    mujoco_gl: str
    env_niceness: int  # the worker's os.nice increment
    video_stride: int = 0  # rollout.videos.frame_stride, 0 with videos off: >0 renders every Nth
    # rollout.render_device resolved for this shard (rollout.render_device), checked at start
    render_env: dict[str, str] = field(default_factory=dict)


@dataclass
class EpisodeSpec:
    suite: str
    task_id: int
    init_state_id: int
    seed: int | None = None  # the episode's run seed (plan.seeds); None: the protocol's


@dataclass
class EpisodeOutcome:
    success_once: bool
    success_at_end: bool
    first_success_step: int | None
    steps: int
    frames: list[np.ndarray] = field(default_factory=list)


def _dedupe_sys_path() -> None:
    """Drop sys.path entries that resolve to the same directory.

    Snakemake's script preamble can add site-packages a second time under another name
    (lib64 -> lib); LIBERO's namespace asset package then sees two roots and refuses to import.
    """
    seen: set[str] = set()
    unique = []
    for entry in sys.path:
        key = os.path.realpath(entry) if entry else entry
        if key not in seen:
            seen.add(key)
            unique.append(entry)
    sys.path[:] = unique


def task_bddl_and_language(suite: str, task_id: int) -> tuple[str, str, np.ndarray]:
    """The task's BDDL file, language and init states from LIBERO's benchmark table.

    A perturbation that rewrites the instruction (`_lan`, `_task`) has it only in its BDDL
    file; LIBERO's task language is the clean one (`libero_eval.suites.instruction`).
    """
    _dedupe_sys_path()
    from libero.libero import benchmark, get_libero_path

    task_suite = benchmark.get_benchmark_dict()[suite]()
    task = task_suite.get_task(task_id)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    language = instruction(suite, task_id) or task.language
    return bddl, language, task_suite.get_task_init_states(task_id)


def physics_only_env(suite: str, task_id: int):
    """A LIBERO env of the task without cameras or renderer (for planning from privileged
    state: the scripted expert's benchmark and tests); reset and seed it as LiberoEpisodeEnv
    does."""
    _dedupe_sys_path()
    from libero.libero.envs.env_wrapper import ControlEnv

    bddl, _language, _init_states = task_bddl_and_language(suite, task_id)
    return ControlEnv(
        bddl_file_name=bddl,
        has_renderer=False,
        has_offscreen_renderer=False,
        use_camera_obs=False,
    )


def seeded_action_chunks(seed: int, count: int, length: int = 16) -> list[np.ndarray]:
    """A fixed replay of seeded random LIBERO chunks: deltas in [-1, 1], gripper -1 or +1
    (benchmarks and tests that need the same actions everywhere)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for _ in range(count):
        chunk = rng.uniform(-1.0, 1.0, size=(length, 7))
        chunk[:, 6] = np.where(rng.random(length) < 0.5, -1.0, 1.0)
        chunks.append(chunk)
    return chunks


class LiberoEpisodeEnv:
    """A LIBERO env that runs episodes under an episode protocol."""

    def __init__(self, settings: EnvSettings, protocol: EpisodeProtocol):
        if settings.reset_mode not in ("fast", "hard"):
            raise ValueError(
                f"rollout.reset_mode: {settings.reset_mode!r} is not one of 'fast', 'hard'"
            )
        os.environ.update(settings.render_env)  # before robosuite is imported
        self._render_checked = not settings.render_env
        os.environ.setdefault("MUJOCO_GL", settings.mujoco_gl)
        if settings.mujoco_gl == "egl":
            os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        self.settings = settings
        self.protocol = protocol
        self._env = None
        self._fast_reset = None  # libero_eval.rollout.fast_reset.FastReset with reset_mode fast
        self._task: tuple[str, int] | None = None
        self._created_initializers = 0  # LIBERO's samplers after the env's creation
        self._switch = RenderSwitch()
        self.task_language = ""
        self._init_states: np.ndarray | None = None
        # reset_seeding "reference": (suite, task) -> (resets done, numpy state after them)
        self._reference_streams: dict[tuple[str, int, int | None], tuple[int, dict]] = {}
        # per-episode state
        self._episode: EpisodeSpec | None = None
        self._policy_steps = 0
        self._max_steps = 0
        self._success_once = False
        self._first_success: int | None = None
        self._last_success = False
        self._frames: list[np.ndarray] = []

    # -- env lifecycle -------------------------------------------------------------------------
    def _load(self, suite: str, task_id: int) -> None:
        if self._task == (suite, task_id):
            return
        self.close()
        if not self._render_checked:
            from libero_eval.rollout.render_device import check_render_env

            check_render_env()  # a wrong device is an error naming the variables
            self._render_checked = True
        _dedupe_sys_path()
        from libero.libero.envs import OffScreenRenderEnv

        bddl, self.task_language, self._init_states = task_bddl_and_language(suite, task_id)
        size = self.settings.camera_size
        fast = self.settings.reset_mode == "fast"
        if fast:
            from libero_eval.rollout.fast_reset import FastReset, capture_compile
        with capture_compile() if fast else contextlib.nullcontext([]) as compiles:
            self._env = OffScreenRenderEnv(
                bddl_file_name=bddl, camera_heights=size, camera_widths=size, horizon=100_000
            )
        # each physics substep computes the robot's state once (bit-identical; single_forward)
        single_forward.install(self._env.env)
        if self.settings.render_mode == "on_demand":
            install_lazy_cameras(self._env.env, self._switch, self.settings.camera_size)
        elif self.settings.render_mode != "every_step":
            raise ValueError(
                f"rollout.render_mode: {self.settings.render_mode!r} is not one of "
                "'on_demand', 'every_step'"
            )
        if fast:
            lazy = None
            if self.settings.render_mode == "on_demand":
                shape = (size, size, 3)
                switch, inner = self._switch, self._env.env

                def lazy(sensor):
                    return LazyCameraSensor(sensor, switch, shape, inner)

            self._fast_reset = FastReset(
                self._env.env, lazy_camera=lazy, compiled=compiles[-1] if compiles else None
            )
        # LIBERO appends one open/close (on/off) sampler per articulated :init state at every
        # _load_model and never clears the list; _reset_internal draws once per entry before
        # placing the fixtures. Its length after creation is what a fresh env resets from.
        self._created_initializers = len(self._env.env.object_property_initializers)
        self._task = (suite, task_id)

    def close(self) -> None:
        if self._env is not None:
            # EGL teardown noise must not fail a shard.
            with contextlib.suppress(Exception):
                self._env.close()
        self._env = None
        self._fast_reset = None
        self._task = None

    @property
    def render_seconds(self) -> float | None:
        """Seconds its cameras have spent rendering (on demand only: None per step)."""
        return self._switch.seconds if self.settings.render_mode == "on_demand" else None

    # -- stepping ------------------------------------------------------------------------------
    def _step(self, action: np.ndarray, render: bool) -> tuple[dict, bool]:
        self._switch.wanted = render or self.settings.render_mode == "every_step"
        try:
            obs, _reward, done, _info = self._env.step(np.asarray(action, dtype=np.float64))
        finally:
            self._switch.wanted = False
        return obs, bool(done)

    def _video_frame_due(self, step_index: int) -> bool:
        stride = self.settings.video_stride
        return stride > 0 and step_index % stride == 0

    def _query(self, obs: dict) -> Observation:
        privileged = None
        if self.settings.send_privileged_state:
            from libero_eval.rollout.privileged import privileged_state

            privileged = privileged_state(self._env, obs)
            # the raw frames, for the reference server's own image check (image_check.py)
            privileged["camera_frames"] = {
                "agentview": np.ascontiguousarray(obs["agentview_image"]),
                "wrist": np.ascontiguousarray(obs["robot0_eye_in_hand_image"]),
            }
        return Observation(
            agentview=np.ascontiguousarray(obs["agentview_image"]),
            wrist=np.ascontiguousarray(obs["robot0_eye_in_hand_image"]),
            task_language=self.task_language,
            privileged_state=privileged,
            proprio={
                key: np.array(obs[key], dtype=np.float64) for key in PROPRIO_KEYS if key in obs
            }
            or None,
            sampling_seed_offset=self._sampling_seed_offset(),
        )

    def _sampling_seed_offset(self) -> int:
        """How far this episode's run seed lies from the run's first seed (the protocol's seed
        here): the policy's sampling seed moves by as much (0 in a single-seed run)."""
        spec = self._episode
        return 0 if spec is None or spec.seed is None else int(spec.seed) - self.protocol.seed

    def start_episode(self, spec: EpisodeSpec) -> Observation:
        """Reset to the spec's init state, run the settle steps, return the first query."""
        self._load(spec.suite, spec.task_id)
        self._episode = spec
        self._policy_steps = 0
        self._max_steps = self.protocol.policy_steps_for(spec.suite)
        self._success_once = False
        self._first_success = None
        self._last_success = False
        self._frames = []
        self._seeded_reset(spec)
        settle = self.protocol.settle_steps
        self._switch.wanted = settle == 0
        try:
            obs = self._env.set_init_state(self._init_states[spec.init_state_id])
        finally:
            self._switch.wanted = False
        for i in range(settle):
            obs, _ = self._step(SETTLE_ACTION, render=i == settle - 1)
        self._maybe_keep_frame(obs, force=True)
        return self._query(obs)

    def _seeded_reset(self, spec: EpisodeSpec) -> None:
        """`env.reset()` with numpy's global stream (which places the fixtures) set as the
        protocol's reset seeding says; never dependent on earlier episodes of this env."""
        seed = reset_seed_of(
            self.protocol.with_seed(spec.seed),
            self.settings.reset_seeding,
            spec.suite,
            spec.task_id,
            spec.init_state_id,
        )
        if self.settings.reset_seeding == "episode" or self.protocol.seed_per_trial:
            self._forget_earlier_resets()
            np.random.seed(seed)
            self._env.reset()
            return
        # The reference seeds once per task and runs trials 0, 1, ... in order: trial i draws
        # from the stream after i resets. Replay the missing resets (cached per task).
        key = (spec.suite, spec.task_id, spec.seed)
        done, state = self._reference_streams.get(key, (0, None))
        if state is None or done > spec.init_state_id:
            self._forget_earlier_resets()
            np.random.seed(seed)
            done = 0
        else:
            np.random.set_state(state)
        while done < spec.init_state_id:
            self._env.reset()
            done += 1
        self._env.reset()
        self._reference_streams[key] = (done + 1, np.random.get_state(legacy=False))

    def _forget_earlier_resets(self) -> None:
        """Drop the samplers LIBERO's earlier resets of this env appended, so the next reset
        draws from numpy's stream as a fresh env's first reset does (libero_10 task 9 and 27
        other tasks with articulated objects; ``bddl_base_domain.py`` ``_add_placement_
        initializer`` appends, ``_reset_internal`` samples each entry)."""
        problem = getattr(self._env, "env", None)  # LIBERO's BDDL problem inside ControlEnv
        initializers = getattr(problem, "object_property_initializers", None)
        if initializers is not None:
            del initializers[self._created_initializers :]

    def _maybe_keep_frame(self, obs: dict, force: bool = False) -> None:
        if self.settings.video_stride > 0 and (force or self._video_frame_due(self._policy_steps)):
            self._frames.append(
                np.concatenate(
                    [
                        obs["agentview_image"][::-1, ::-1],
                        obs["robot0_eye_in_hand_image"][::-1, ::-1],
                    ],
                    axis=1,
                )
            )

    def step_chunk(self, actions: np.ndarray) -> Observation | EpisodeOutcome:
        """Execute a chunk of LIBERO actions; the next query, or the outcome at the end."""
        if self._episode is None:
            raise RuntimeError("step_chunk called before start_episode")
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != 7 or not np.all(np.isfinite(actions)):
            raise ValueError(
                f"policy chunk must be finite float[N, 7] LIBERO actions, got shape "
                f"{actions.shape} (non-finite: {int((~np.isfinite(actions)).sum())})"
            )
        if self.protocol.actions_per_query is not None:
            actions = actions[: self.protocol.actions_per_query]
        obs = None
        remaining = self._max_steps - self._policy_steps
        n = len(actions) if self.protocol.run_whole_chunks else min(len(actions), remaining)
        for i in range(n):
            last_in_chunk = i == n - 1
            step_number = self._policy_steps + 1
            ends_here = last_in_chunk and step_number >= self._max_steps
            render = (last_in_chunk and not ends_here) or self._video_frame_due(step_number)
            obs, success = self._step(actions[i], render=render)
            self._policy_steps = step_number
            self._last_success = success
            self._maybe_keep_frame(obs)
            if success and not self._success_once:
                self._success_once = True
                self._first_success = self._counted(step_number)
            if success and self.protocol.stop_at_success:
                return self._finish()
        if self._policy_steps >= self._max_steps:
            return self._finish()
        return self._query(obs)

    def _counted(self, policy_steps: int) -> int:
        return self.protocol.reported_steps(policy_steps)

    def _finish(self) -> EpisodeOutcome:
        outcome = EpisodeOutcome(
            success_once=self._success_once,
            success_at_end=self._last_success,
            first_success_step=self._first_success,
            steps=self._counted(self._policy_steps),
            frames=self._frames,
        )
        self._episode = None
        self._frames = []
        return outcome

    def sim_state(self) -> np.ndarray:
        return self._env.get_sim_state()

    def fixture_positions(self) -> dict[str, np.ndarray]:
        """Where the scene's fixtures (cabinets, stoves, ...) stand: what the reset stream
        decides and `set_init_state` does not restore."""
        inner = self._env.env
        model = inner.sim.model
        return {
            name: np.array(model.body_pos[model.body_name2id(fixture.root_body)])
            for name, fixture in inner.fixtures_dict.items()
        }
