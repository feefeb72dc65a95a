"""toyvla end to end: a family from outside the package, registered from its config, served by
the server it brings, through the Snakemake workflow (docs/design.md, "Adding a policy family").
"""

import os
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import workflow_dir
from test_workflow_e2e import run_workflow

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "config.yaml"

pytestmark = pytest.mark.workflow


@pytest.fixture
def toyvla_importable(monkeypatch):
    """The family importable as a user's would be: its folder's parent on PYTHONPATH."""
    path = [str(HERE.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))


def test_a_family_of_its_own_runs_end_to_end_through_the_server_it_brings(
    tmp_path, toyvla_importable
):
    workdir = workflow_dir(tmp_path / "work")
    run = run_workflow(workdir, CONFIG)
    assert run.returncode == 0, run.stderr[-3000:]
    results = workdir / "results" / "toyvla"
    episodes = pd.read_parquet(results / "summary" / "episodes.parquet")
    assert len(episodes) == 2
    assert episodes["error"].isna().all(), episodes["error"].tolist()
    assert (episodes["steps"] == 16).all()
    # 16 steps in chunks of 8: two requests an episode, each answered by toyvla's server (the
    # adapter refuses an answer without its mark); its log counts them, the capacity probe's too
    assert (episodes["policy_calls"] == 2).all()
    log = (workdir / "logs" / "toyvla" / "serve" / "slot0.log").read_text()
    answered = re.findall(r"^toyvla: answered request \d+", log, flags=re.MULTILINE)
    assert len(answered) >= episodes["policy_calls"].sum()
    assert "toyvla: listening on 127.0.0.1:" in log


def test_the_reference_server_serves_it_through_its_part(tmp_path, toyvla_importable):
    """toyvla lists `reference` too: the serve job starts the reference server, which finds
    toyvla's part of it by the module the config names (reference_server.py beside this
    file) and answers toyvla's requests with its own policy (`hold`)."""
    workdir = workflow_dir(tmp_path / "work")
    overlay = tmp_path / "reference.yaml"
    overlay.write_text("server: {backend: reference, reference: {policy: hold}}\n")
    run = run_workflow(workdir, CONFIG, str(overlay))
    assert run.returncode == 0, run.stderr[-3000:]
    episodes = pd.read_parquet(workdir / "results" / "toyvla" / "summary" / "episodes.parquet")
    assert len(episodes) == 2 and episodes["error"].isna().all(), episodes["error"].tolist()
    assert (episodes["policy_calls"] == 2).all()
    log = (workdir / "logs" / "toyvla" / "serve" / "slot0.log").read_text()
    assert "libero_eval.reference.server" in log and "toyvla: listening" not in log
    assert "server policy 'hold' ready" in log


def test_a_backend_it_does_not_list_is_refused(tmp_path, toyvla_importable):
    workdir = workflow_dir(tmp_path / "work")
    overlay = tmp_path / "sglang.yaml"
    overlay.write_text("server: {backend: sglang}\n")
    run = run_workflow(workdir, CONFIG, str(overlay), "-n")
    assert run.returncode != 0
    assert (
        "server.backend sglang does not serve policy.family toyvla (toyvla), which is "
        "served by family, reference" in run.stdout + run.stderr
    )


def test_a_family_module_that_is_not_importable_is_named(tmp_path):
    workdir = workflow_dir(tmp_path / "work")
    env_path = os.environ.get("PYTHONPATH", "")
    assert str(HERE.parent) not in env_path.split(os.pathsep)
    run = run_workflow(workdir, CONFIG, "-n")
    assert run.returncode != 0
    assert "policy.family_modules: cannot import 'toyvla'" in run.stdout + run.stderr
