"""The whole workflow, end to end: real Snakemake jobs, a real HTTP policy server, real LIBERO."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from conftest import workflow_dir

from libero_eval.cli import run_status
from libero_eval.rollout.dispatch_log import ENV_WORK
from libero_eval.service import capacity_of

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = [pytest.mark.workflow, pytest.mark.libero]


class Run:
    """A finished snakemake invocation and every descendant process seen while it ran."""

    def __init__(self, returncode: int, stdout: str, stderr: str, descendants: set[int]):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.descendants = descendants

    def survivors(self) -> list[int]:
        alive = []
        for pid in self.descendants:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive


def run_workflow(workdir: Path, configfile: Path, *extra: str, cores: int = 2) -> Run:
    """Run snakemake in `workdir` (its own results/, logs/ and .snakemake/), polling its
    process tree so leftover servers/env workers can be counted.

    Extra config files go right after `configfile` (one --configfile flag merges them in order).
    """
    proc = subprocess.Popen(
        [*SNAKEMAKE, "--cores", str(cores), "--configfile", str(configfile), *extra],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                seen.update(child.pid for child in root.children(recursive=True))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate(timeout=900)
    stop.set()
    watcher.join()
    return Run(proc.returncode, stdout, stderr, seen)


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The runs' private working directory (tests/conftest.py `workflow_dir`)."""
    return workflow_dir(tmp_path / "work")


# The demo run's server takes this long to start, as a GPU server loads its weights: its 2
# envs are started while it loads (which of the two is ready first is a race on a loaded
# machine; the assertions below hold either way, so a short delay tests the overlap).
SERVER_START_S = 12.0


@pytest.fixture
def short_run(tmp_path):
    """A 2-task x 2-init-state evaluation with 48-step episodes under its own run id, against
    a server that takes SERVER_START_S to start."""
    run_id = f"pytest_e2e_{tmp_path.name}"
    configfile = tmp_path / "config.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "plan": {"task_ids": [0, 1], "num_trials_per_task": 2},
                "server": {"reference": {"policy": "hold", "startup_delay_s": SERVER_START_S}},
                # 40: not a whole number of 16-action chunks (rlinf runs whole chunks)
                "rollout": {"send_privileged_state": False, "max_steps": 40},
            }
        )
    )
    return run_id, configfile


def test_demo_shaped_run_end_to_end_then_nothing_to_do_and_bad_records_rerun(workdir, short_run):
    run_id, configfile = short_run
    first = run_workflow(workdir, configfile)
    assert first.returncode == 0, first.stderr[-3000:]
    results = workdir / "results" / run_id

    # One Parquet row per planned episode, with the schema's values filled in.
    episodes = pd.read_parquet(results / "summary" / "episodes.parquet")
    assert len(episodes) == 4
    assert set(zip(episodes.task_id, episodes.init_state_id, strict=True)) == {
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    }
    assert episodes["error"].isna().all(), episodes["error"].tolist()
    assert (episodes["steps"] == 48).all()  # max_steps 40 in whole chunks of 16
    assert (episodes["policy_calls"] == 3).all()
    assert episodes["task_language"].str.startswith("pick up the black bowl").all()
    assert (episodes["protocol"] == "rlinf").all()
    assert episodes["server_url"].str.startswith("http://127.0.0.1:").all()

    # The summary is printed at the end of the run and written as Markdown + CSV.
    summary = (results / "summary" / "summary.md").read_text()
    assert "| libero_spatial | (suite) | 0.0% [0.0, 49.0]" in summary
    assert "| libero_spatial | (suite)" in first.stdout
    # ... and says why mean steps (48) exceed rollout.max_steps (40)
    assert "| 4 | 0 | 48 |" in summary
    assert "up to the limit rollout.max_steps = 40" in summary
    assert "Episodes run whole action chunks" in summary
    per_task = pd.read_csv(results / "summary" / "per_task.csv")
    assert per_task["num_trajectories"].tolist() == [2, 2]
    # ... and where the wall time went, from the workflow's launch (its onstart line)
    assert "#### Where the wall time went (from the workflow launch)" in summary
    timeline = pd.read_csv(results / "summary" / "efficiency.csv").iloc[0]
    assert 0 < timeline["start_to_ready_s"] < timeline["first_request_s"] < timeline["wall_s"]
    assert timeline["wall_over_bound"] > 0

    # Milestones in the seed's order.
    log = (workdir / "logs" / run_id / "eval_embodiment.log").read_text()
    order = [
        log.index("[workflow] workflow launch: "),
        log.index("server launch"),
        log.index("[serve slot=0] capacity: batch 1 in"),  # measured before it is ready
        log.index("server ready"),
        log.index("rank shard000 -> http://127.0.0.1:"),
        log.index("[libero eval] task_id="),
        log.index("summary: success_once="),
    ]
    assert order == sorted(order)
    assert len(re.findall(r"\[libero eval\] task_id=\d, trial_id=\d, success=False", log)) == 4

    # The envs came up while the server started; the first request waited for both; the shard
    # ended after its last answer, its workers closed (the dispatch log's timeline, wall clock).
    dispatch = json.loads((results / "shards" / "shard000.dispatch.json").read_text())
    timeline = dispatch["timeline"]
    assert None not in timeline.values(), timeline
    assert timeline["job_start"] <= timeline["envs_started"] <= timeline["envs_ready"]
    # the envs were started before the server was ready (which of the two is ready first is
    # a race: on a loaded machine the envs' start may outlast the CPU server's)
    assert timeline["envs_started"] <= timeline["service_ready"]
    assert timeline["service_ready"] <= timeline["first_request"] <= timeline["last_answer"]
    assert timeline["last_answer"] <= timeline["shard_end"]
    assert timeline["first_request"] == min(r[0] for r in dispatch["requests"])
    assert dispatch["envs_choice"]["envs"] == 2 and dispatch["envs_choice"]["setting"] == 2
    # Each observation says what it took in its env worker: 4 episodes' first observations,
    # and the 2 of each episode's 3 chunks that did not end it; the cameras rendered once each.
    work = pd.DataFrame(dispatch["env_work"], columns=ENV_WORK)
    assert work["command"].value_counts().to_dict() == {"chunk": 8, "start": 4}
    assert (work["render_s"] > 0).all() and (work["cpu_s"] > 0).all()
    assert (work["wall_s"] > work["render_s"]).all()
    chunks = work[work["command"] == "chunk"]
    assert (chunks["shard_s"] >= chunks["wall_s"]).all() and work["shard_s"].isna().sum() == 4
    row = pd.read_csv(results / "summary" / "efficiency.csv").iloc[0]
    assert row["env_query_s"] == pytest.approx(
        row["env_sim_s"] + row["env_render_s"] + row["env_handoff_s"]
    )
    if timeline["envs_ready"] < timeline["service_ready"]:  # renders with no server at work
        assert row["env_start_render_s"] > 0
    assert "| an env's query, mid-run (in its worker) |" in summary
    assert dispatch["dispatch_choice"]["merged_dispatch"] is None  # Cosmos3: no merging
    assert log.index("starting 2 envs") < log.index("server ready")
    assert re.search(r"envs ready: 2 envs in [0-9.]+ s \((before|after) the server was ready", log)
    assert log.index("server ready") < log.index("first request ") < log.index("shard end ")
    serve_log = (workdir / "logs" / run_id / "serve" / "slot0.log").read_text()
    assert f"start-up delay: {SERVER_START_S:.1f} s (server.reference.startup_delay_s)" in serve_log
    # The server's own capacity stays with the run after it stopped: the shard keeps the
    # service file as it was at ready (Snakemake removes service outputs when the group job
    # ends), and the report reads it from there where the file is gone.
    capacity = dispatch["server"]["capacity"]
    assert capacity is not None and capacity["max_batch_size"] == 8, capacity
    assert [p["observations"] for p in capacity["probes"]] == [1, 8]
    assert row["capacity_obs_per_s"] == pytest.approx(capacity["obs_per_s"])
    assert dispatch["server"]["timeline"]["ready"] <= timeline["service_ready"]  # then seen
    stopped = capacity_of(results / "servers" / "slot0.json")  # None where it is gone
    assert stopped is None or stopped == capacity

    # The server and env workers were torn down with the run: none of them is left.
    assert len(first.descendants) >= 4  # launcher, server, shard, 2 env workers
    time.sleep(1)
    assert first.survivors() == []

    # `libero-eval status` times the invocation from its line in the event log.
    status = run_status(results)
    assert (status.since, status.done_since, status.eta_s) == ("invocation", 4, 0.0)
    assert "this invocation (4 episodes in it), ETA done" in status.line()

    # Running the same command again does no work.
    second = run_workflow(workdir, configfile)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Nothing to be done" in second.stdout + second.stderr

    # The report's first screen (the workflow description beside the job graph) shows the
    # success table and how steps count.
    report = workdir / "report.html"
    made = run_workflow(workdir, configfile, "--report", str(report))
    assert made.returncode == 0, made.stderr[-3000:]
    found = re.search(r"var workflow_desc = (.*?);\n", report.read_text())
    assert found, "report.html has no workflow description"
    landing = json.loads(found.group(1))
    assert f'Result of run <tt class="docutils literal">{run_id}</tt>' in landing
    assert "<td>libero_spatial</td>\n<td>0.0% [0.0, 49.0]</td>" in landing
    assert "Episodes run whole action chunks" in landing

    rerun_bad_records(workdir, configfile, results, episodes)


def rerun_bad_records(workdir: Path, configfile: Path, results: Path, episodes) -> None:
    """Bad records in the finished run's store: JSON but not an object (the rollout job fell
    out of the DAG, and the aggregate failed on Snakemake's "filesystem latency" message), a
    wrongly typed field (ArrowInvalid) and a record copied over another episode's file ("2
    result rows share"). The rerun names each file, reruns exactly those episodes and moves
    the files aside; the next run has nothing to do."""
    (store,) = (results / "episodes").iterdir()
    spatial = store / "libero_spatial"
    bad = {
        spatial / "task00_init00.json": b"[]",
        spatial / "task01_init00.json": (spatial / "task01_init00.json")
        .read_bytes()
        .replace(b'"success_once": false', b'"success_once": "maybe"'),
        spatial / "task00_init01.json": (spatial / "task01_init01.json").read_bytes(),
    }
    for path, content in bad.items():
        path.write_bytes(content)
    untouched = (spatial / "task01_init01.json").read_bytes()

    third = run_workflow(workdir, configfile)
    assert third.returncode == 0, third.stderr[-3000:]
    for path, content in bad.items():
        assert f"bad record {path.relative_to(workdir)}:" in third.stderr
        (kept,) = (store / "quarantine" / "libero_spatial").glob(f"{path.name}.*[0-9]")
        assert kept.read_bytes() == content
    assert "not a JSON object but list" in third.stderr
    assert "success_once is 'maybe', not of type bool" in third.stderr
    assert "the record of libero_spatial task 1 init state 1, not of" in third.stderr
    assert (spatial / "task01_init01.json").read_bytes() == untouched  # reused, not rerun
    again = pd.read_parquet(results / "summary" / "episodes.parquet")
    assert len(again) == 4
    rerun = again.merge(episodes, on=["task_id", "init_state_id"], suffixes=("", "_before"))
    assert (rerun["finished_at"] != rerun["finished_at_before"]).sum() == 3
    assert (rerun["steps"] == rerun["steps_before"]).all()
    fourth = run_workflow(workdir, configfile)
    assert "Nothing to be done" in fourth.stdout + fourth.stderr


def test_large_plan_dry_run_shows_one_server_per_slot(tmp_path, workdir):
    configfile = tmp_path / "full.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "run_id": f"pytest_dry_{tmp_path.name}",
                "plan": {
                    "suites": ["libero_spatial", "libero_object", "libero_goal", "libero_10"],
                    "task_ids": "all",
                    "num_trials_per_task": 50,
                },
                "server": {"num_slots": 8, "reference": {"policy": "hold"}},
                "rollout": {"send_privileged_state": False, "shards_per_slot": 2},
            }
        )
    )
    # Each slot's group (server + 2 shards x 2 envs) needs 4 cores: a 32-core node runs 8.
    dry = run_workflow(workdir, configfile, "-n", "--quiet", "rules", cores=32)
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout + dry.stderr, flags=re.M))
    assert counts["serve"] == "8"
    assert counts["rollout"] == "16"
    assert counts["aggregate"] == "1"


def selftest_overlay(
    tmp_path, run_id: str, suites: tuple[str, ...] = ("libero_spatial", "libero_object"), **policy
) -> Path:
    """config/selftest.yaml cut to tasks 0 and 1 of `suites` (4 episodes by default)."""
    overlay = tmp_path / f"{run_id}.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "plan": {"suites": list(suites), "task_ids": [0, 1]},
                "policy": policy,
            }
        )
    )
    return overlay


@pytest.fixture
def selftest_runs(tmp_path):
    run_ids = [f"pytest_selftest_ok_{tmp_path.name}", f"pytest_selftest_bad_{tmp_path.name}"]
    return run_ids


def test_selftest_passes_with_the_expert_and_fails_loudly_on_a_wrong_convention(
    tmp_path, workdir, selftest_runs
):
    ok_run, bad_run = selftest_runs
    defaults, selftest = REPO / "config" / "config.yaml", REPO / "config" / "selftest.yaml"

    good = run_workflow(workdir, defaults, str(selftest), str(selftest_overlay(tmp_path, ok_run)))
    assert good.returncode == 0, good.stderr[-3000:]
    episodes = pd.read_parquet(workdir / "results" / ok_run / "summary" / "episodes.parquet")
    assert episodes["success_once"].all(), episodes[["suite", "task_id", "steps"]]
    assert "self-test passed" in (workdir / "results" / ok_run / "selftest.txt").read_text()

    # De-normalizing with the `global` block instead of `global_raw`: every episode fails (the
    # 2 spatial ones: each runs to its step limit, so fewer is quicker).
    spatial = ("libero_spatial",)
    bad_overlay = selftest_overlay(tmp_path, bad_run, spatial, normalization="quantile")
    bad = run_workflow(workdir, defaults, str(selftest), str(bad_overlay))
    assert bad.returncode != 0
    assert "SELF-TEST FAILED: the scripted expert succeeded on 0% of 2 episodes" in bad.stderr
    assert not (workdir / "results" / bad_run / "selftest.txt").exists()


@pytest.fixture
def throughput_runs(tmp_path):
    run_ids = [f"pytest_envs1_{tmp_path.name}", f"pytest_envs3_{tmp_path.name}"]
    return run_ids


def throughput_overlay(
    path: Path, run_id: str, envs_per_shard: int, reset_mode: str = "fast", **rollout
) -> Path:
    """4 episodes (2 tasks x 2 init states) of the scripted expert, cosmos protocol, 150 steps."""
    path.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "plan": {"task_ids": [0, 1], "num_trials_per_task": 2},
                "rollout": {
                    "protocol": "cosmos",
                    "max_steps": 150,
                    "envs_per_shard": envs_per_shard,
                    "reset_mode": reset_mode,
                    **rollout,
                },
            }
        )
    )
    return path


def test_throughput_settings_change_no_outcome_and_a_rerun_with_other_ones_reuses_all(
    tmp_path, workdir, throughput_runs
):
    """The scripted expert on 4 episodes with 1 env per shard and LIBERO's hard reset, and with
    up to 3 chosen by the shard (total_num_envs auto) and the fast reset: the same outcomes,
    steps and seeds per episode. Then the first run again with 3 envs and fast resets reuses
    every episode."""
    defaults = REPO / "config" / "config.yaml"
    frames = []
    for run_id, envs, reset_mode in zip(throughput_runs, (1, 3), ("hard", "fast"), strict=True):
        auto = {"total_num_envs": "auto"} if envs > 1 else {}
        overlay = throughput_overlay(tmp_path / f"{run_id}.yaml", run_id, envs, reset_mode, **auto)
        run = run_workflow(workdir, defaults, str(overlay), cores=4)
        assert run.returncode == 0, run.stderr[-3000:]
        frames.append(
            pd.read_parquet(workdir / "results" / run_id / "summary" / "episodes.parquet")
            .sort_values(["task_id", "init_state_id"])
            .reset_index(drop=True)
        )
    columns = ["task_id", "init_state_id", "success_once", "success_at_end", "steps"]
    columns += ["first_success_step", "seed", "episode_seed", "policy_calls", "error"]
    pd.testing.assert_frame_equal(frames[0][columns], frames[1][columns])
    assert len(frames[0]) == 4 and frames[0]["success_once"].any()
    assert frames[0]["episode_seed"].nunique() == 4

    # Run 1 again with 3 envs per shard and fast resets: every finished episode is reused.
    again = throughput_overlay(tmp_path / "again.yaml", throughput_runs[0], 3)
    rerun = run_workflow(workdir, defaults, str(again), cores=4)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = pd.read_parquet(
        workdir / "results" / throughput_runs[0] / "summary" / "episodes.parquet"
    ).sort_values(["task_id", "init_state_id"])
    assert after["finished_at"].tolist() == frames[0]["finished_at"].tolist()


def test_three_seeds_show_their_spread_and_a_fourth_seed_runs_only_its_episodes(tmp_path, workdir):
    """1 task x 1 init state x 3 seeds of 16 steps (hold policy), then a fourth seed appended."""
    run_id = f"pytest_seeds_{tmp_path.name}"
    configfile = tmp_path / "config.yaml"
    config = {
        "run_id": run_id,
        "plan": {"task_ids": [0], "init_state_ids": [0], "seeds": [0, 1, 2]},
        "server": {"reference": {"policy": "hold"}},
        "rollout": {"send_privileged_state": False, "max_steps": 16, "envs_per_shard": 2},
    }
    configfile.write_text(yaml.safe_dump(config))
    results, logs = workdir / "results" / run_id, workdir / "logs" / run_id
    first = run_workflow(workdir, configfile)
    assert first.returncode == 0, first.stderr[-3000:]
    episodes = pd.read_parquet(results / "summary" / "episodes.parquet")
    assert sorted(episodes["seed"]) == [0, 1, 2]
    assert episodes["episode_seed"].nunique() == 3  # each seed its own reset stream
    store = next((results / "episodes").iterdir()) / "libero_spatial"
    assert sorted(p.name for p in store.iterdir()) == [
        f"task00_init00_seed{s}.json" for s in (0, 1, 2)
    ]
    per_seed = pd.read_csv(results / "summary" / "per_seed.csv")
    assert sorted(per_seed[per_seed["level"] == "overall"]["seed"]) == [0, 1, 2]
    per_suite = pd.read_csv(results / "summary" / "per_suite.csv")
    assert (per_suite["num_seeds"] == 3).all() and (per_suite["success_once_seed_std"] == 0).all()
    assert "## Seeds" in (results / "summary" / "summary.md").read_text()
    assert "<h2>Seeds</h2>" in (results / "report" / "success_table.html").read_text()
    assert (results / "report" / "success_by_seed.png").stat().st_size > 0
    before = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}

    config["plan"]["seeds"] = [0, 1, 2, 3]
    configfile.write_text(yaml.safe_dump(config))
    second = run_workflow(workdir, configfile)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir() if p.name in before} == before
    assert (store / "task00_init00_seed3.json").is_file()
    log = (logs / "eval_embodiment.log").read_text()
    assert "(1 to run, 3 already finished" in log
    assert len(pd.read_parquet(results / "summary" / "episodes.parquet")) == 4


def test_a_shard_failing_while_its_server_starts_takes_the_server_down_with_it(tmp_path, workdir):
    """The envs start while the server loads: a shard can now fail before its server is ready.
    Its first episode's env raises at the start and the shard fails once that record is
    persisted (fault injection), long before the server's 600 s start ends: Snakemake fails
    the group and tears the starting server down; no process of the run is left, and the
    recorded episode stays in the store for the rerun."""
    run_id = f"pytest_early_fail_{tmp_path.name}"
    configfile = tmp_path / "config.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "plan": {"task_ids": [0], "num_trials_per_task": 2},
                "server": {"reference": {"policy": "hold", "startup_delay_s": 600.0}},
                "rollout": {"send_privileged_state": False, "max_steps": 16},
            }
        )
    )
    marker = tmp_path / "failed_once"
    fault = f"raise_env_at_episode=1;fail_shard_once=shard000:{marker}"
    proc = subprocess.run(
        [*SNAKEMAKE, "--cores", "2", "--configfile", str(configfile)],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "LIBERO_EVAL_FAULT": fault},
        timeout=900,
        check=False,
    )
    assert proc.returncode != 0 and marker.exists(), proc.stderr[-3000:]
    log = (workdir / "logs" / run_id / "eval_embodiment.log").read_text()
    assert "server launch" in log and "server ready" not in log  # it never got there
    assert "shard000: injected failure (fail_shard_once" in log
    # the episode recorded before the server was ready stays in the store
    records = list((workdir / "results" / run_id / "episodes").rglob("*.json"))
    assert len(records) == 1 and "injected env error" in records[0].read_text()
    ours = [p for p in psutil.process_iter(["cwd"]) if p.info["cwd"] == str(workdir)]
    _, alive = psutil.wait_procs(ours, timeout=60)  # the teardown's SIGTERM grace at most
    assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
