"""report.published: measured success against published figures, with exact tests."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import make_record
from scipy.stats import binomtest, fisher_exact

from libero_eval.analysis.aggregate import markdown_summary, success_tables, write_summary
from libero_eval.analysis.published import (
    published_checks,
    published_markdown,
    published_test,
    verdict,
)
from libero_eval.config import ConfigError, check_config, validate_config
from libero_eval.config_rules import check_published_config
from libero_eval.plan import Episode, make_shards, plan_table
from libero_eval.report import success_table_html
from libero_eval.store import RESULT_COLUMNS, write_results

REPO = Path(__file__).resolve().parents[1]


def records(counts: dict[str, tuple[int, int]]) -> list[dict]:
    """Result rows: per suite `(successes, episodes)`, one task, init states 0..episodes-1,
    the first `successes` of them succeed (success_at_end never, to tell the metrics apart)."""
    rows = []
    for suite, (successes, episodes) in counts.items():
        for init in range(episodes):
            rows.append(
                make_record(
                    run_id="published",
                    suite=suite,
                    task_id=0,
                    task_language=f"{suite} task 0",
                    init_state_id=init,
                    success_once=init < successes,
                    success_at_end=False,
                    first_success_step=40 if init < successes else None,
                )
            )
    return rows


def table_of(counts: dict[str, tuple[int, int]]) -> pd.DataFrame:
    return success_tables(pd.DataFrame(records(counts), columns=RESULT_COLUMNS))


def entry(rate: float, n: int | None = None, source: str = "paper, Table 1") -> dict:
    return {"rate": rate, "n": n, "source": source}


# ----------------------------------------------------------------------------- the tests


def test_binomial_p_values_are_the_hand_computed_ones():
    # 3 of 4 against 1/2: P(X <= 1) + P(X >= 3) = (1 + 4 + 4 + 1) / 16
    assert published_test(3, 4, 0.5) == ("binomial", pytest.approx(10 / 16))
    # 0 of 10 against 1/2: only 0 and 10 are as unlikely, 2 / 2**10
    assert published_test(0, 10, 0.5) == ("binomial", pytest.approx(2 / 1024))


def test_fisher_p_values_are_the_hand_computed_ones():
    # identical tables: nothing is more extreme than what was seen
    assert published_test(9, 10, 0.9, n=10) == ("fisher_exact", pytest.approx(1.0))
    # 0/10 against 10/10: the two most extreme tables of C(20, 10) with these margins
    assert published_test(0, 10, 1.0, n=10)[1] == pytest.approx(2 / 184756)


def test_p_values_match_scipy_at_libero_sizes():
    # 475/500 measured against the 96.8% of 500 a paper reports (484 successes)
    expected = fisher_exact([[475, 25], [484, 16]]).pvalue
    assert published_test(475, 500, 0.968, n=500)[1] == pytest.approx(expected, rel=1e-12)
    assert published_test(475, 500, 0.968)[1] == pytest.approx(
        binomtest(475, 500, 0.968).pvalue, rel=1e-12
    )
    # the published count is rounded from rate * n: 0.9705 * 200 = 194.1 -> 194
    assert published_test(180, 200, 0.9705, n=200)[1] == pytest.approx(
        fisher_exact([[180, 20], [194, 6]]).pvalue, rel=1e-12
    )


def test_the_published_n_matters_it_is_not_treated_as_exact():
    """The same gap differs against an exact rate but is consistent against a small sample."""
    assert verdict(published_test(40, 50, 0.95)[1]).startswith("differs")
    assert verdict(published_test(40, 50, 0.95, n=20)[1]) == "consistent"


def test_verdict_wording_and_alpha():
    assert verdict(0.05) == "consistent"
    assert verdict(0.0499) == "differs (p = 0.050)"
    assert verdict(0.012) == "differs (p = 0.012)"
    assert verdict(1.08e-5) == "differs (p = 1.1e-05)"
    assert verdict(0.08, alpha=0.1) == "differs (p = 0.080)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 4, 0.5), "successes <= trials"),
        ((0, 0, 0.5), "trials >= 1"),
        ((3, 4, 96.8), r"fraction in \[0, 1\]"),
        ((3, 4, 0.5, 0), "n must be >= 1"),
    ],
)
def test_bad_test_input_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        published_test(*args)


def test_consistent_and_differing_suites_in_one_check():
    table = table_of({"libero_spatial": (48, 50), "libero_goal": (30, 50)})
    published = {
        "libero_spatial": entry(0.968, 500, "openpi README"),
        "libero_goal": entry(0.98, 500, "openpi README"),
    }
    checks = published_checks(table, published).set_index("suite")
    spatial, goal = checks.loc["libero_spatial"], checks.loc["libero_goal"]
    counts = spatial[["successes", "trials", "published_successes"]].tolist()
    assert counts == [48, 50, 484]
    assert spatial["p_value"] == pytest.approx(fisher_exact([[48, 2], [484, 16]]).pvalue)
    assert spatial["verdict"] == "consistent"
    p_goal = fisher_exact([[30, 20], [490, 10]]).pvalue
    assert goal["p_value"] == pytest.approx(p_goal)
    assert p_goal < 1e-3 and goal["verdict"] == verdict(p_goal)
    assert goal["verdict"].startswith("differs (p = ")
    assert spatial["measured_ci_low"] < 0.96 < spatial["measured_ci_high"]
    assert set(checks["test"]) == {"fisher_exact"}


def test_the_metric_is_success_once_unless_configured():
    table = table_of({"libero_spatial": (10, 10)})
    published = {"libero_spatial": entry(1.0, 10)}
    once = published_checks(table, published).iloc[0]
    assert (once["successes"], once["verdict"]) == (10, "consistent")
    at_end = published_checks(table, published, metric="success_at_end").iloc[0]
    assert at_end["successes"] == 0 and at_end["verdict"].startswith("differs")


def test_alpha_decides_the_verdict():
    table = table_of({"libero_spatial": (7, 10)})
    published = {"libero_spatial": entry(0.95)}
    p = binomtest(7, 10, 0.95).pvalue
    assert 0.01 < p < 0.05
    assert published_checks(table, published, alpha=0.05).iloc[0]["verdict"].startswith("differs")
    assert published_checks(table, published, alpha=0.01).iloc[0]["verdict"] == "consistent"


def test_missing_suites_are_listed_not_dropped_and_unpublished_ones_not_checked():
    table = table_of({"libero_spatial": (9, 10), "libero_object": (9, 10)})
    published = {
        "libero_spatial": entry(0.9, 10),
        "libero_10": entry(0.85, 500),
        "overall": entry(0.9, 1000),
    }
    checks = published_checks(table, published)
    assert list(checks["suite"]) == ["libero_10", "libero_spatial", "overall"]
    absent = checks.iloc[0]
    assert absent["verdict"] == "not evaluated" and pd.isna(absent["trials"])
    assert math.isnan(absent["p_value"])
    # the run's overall pools other suites than the published average: no test
    overall = checks.iloc[2]
    assert overall["verdict"] == "not comparable (run lacks libero_10; run adds libero_object)"
    assert math.isnan(overall["p_value"])
    assert checks.iloc[1]["verdict"] == "consistent"


def test_overall_is_tested_against_the_pooled_rate_when_the_suites_match():
    table = table_of({"libero_spatial": (9, 10), "libero_goal": (7, 10)})
    published = {
        "libero_spatial": entry(0.9, 10),
        "libero_goal": entry(0.7, 10),
        "overall": entry(0.8, 20),
    }
    overall = published_checks(table, published).set_index("suite").loc["overall"]
    assert (overall["successes"], overall["trials"]) == (16, 20)
    assert overall["p_value"] == pytest.approx(1.0)
    only_overall = published_checks(table, {"overall": entry(0.8)}).iloc[0]
    assert only_overall["p_value"] == pytest.approx(binomtest(16, 20, 0.8).pvalue)


def test_nothing_published_changes_nothing():
    table = table_of({"libero_spatial": (9, 10)})
    assert published_checks(table, {}).empty and published_checks(table, None).empty
    assert markdown_summary(table, "t", published=published_checks(table, {})) == (
        markdown_summary(table, "t")
    )
    assert "published" not in markdown_summary(table, "t").lower()
    assert "published" not in success_table_html(table).lower()


def test_summary_markdown_and_html_show_the_table():
    table = table_of({"libero_spatial": (48, 50), "libero_goal": (30, 50)})
    published = {
        "libero_spatial": entry(0.968, 500, "openpi README | LIBERO"),
        "libero_goal": entry(0.98, None, "paper"),
    }
    checks = published_checks(table, published)
    markdown = markdown_summary(table, "t", published=checks)
    section = markdown[markdown.index("## Measured vs published") : markdown.index("## Tasks")]
    assert markdown.index("## Suites") < markdown.index("## Measured vs published")
    p_spatial = fisher_exact([[48, 2], [484, 16]]).pvalue
    assert (
        f"| libero_spatial | 96.0% [86.5, 98.9] (48/50) | 96.8% (484/500) "
        f"| openpi README \\| LIBERO | Fisher exact | {p_spatial:.3g} | consistent |"
    ) in section
    p_goal = binomtest(30, 50, 0.98).pvalue
    assert "| libero_goal | 60.0% [46.2, 72.4] (30/50) | 98.0% | paper | exact binomial" in section
    assert f"| {verdict(p_goal)} |" in section
    assert "| measured (95% Wilson CI) |" in section
    assert published_markdown(checks) in markdown
    page = success_table_html(table, published=checks)
    assert "Measured vs published" in page and "openpi README | LIBERO" in page
    assert verdict(p_goal) in page


def test_write_summary_adds_the_check_to_summary_md_and_per_suite_csv(tmp_path):
    rows = records({"libero_spatial": (48, 50), "libero_goal": (30, 50)})
    shard = tmp_path / "shards" / "shard000.parquet"
    write_results(rows, shard)
    episodes = [Episode(r["suite"], r["task_id"], r["init_state_id"]) for r in rows]
    plan = tmp_path / "plan.csv"
    plan_table(make_shards(episodes, 1, 1)).to_csv(plan, index=False)
    names = ("episodes", "per_task", "per_suite", "tables", "markdown")
    outputs = {name: str(tmp_path / name) for name in names}
    published = {"libero_goal": entry(0.98, 500), "overall": entry(0.97)}
    write_summary([str(shard)], str(plan), outputs, "w", published=published)

    markdown = Path(outputs["markdown"]).read_text()
    assert "## Measured vs published" in markdown
    assert "| libero_goal | 60.0% [46.2, 72.4] (30/50) | 98.0% (490/500)" in markdown
    per_suite = pd.read_csv(outputs["per_suite"]).set_index("suite")
    assert per_suite.loc["libero_goal", "published_n"] == 500
    assert per_suite.loc["libero_goal", "published_verdict"].startswith("differs")
    assert per_suite.loc["all", "published_rate"] == 0.97
    # the run's overall pools libero_spatial too, which the published figures leave out
    assert per_suite.loc["all", "published_verdict"] == "not comparable (run adds libero_spatial)"
    assert pd.isna(per_suite.loc["libero_spatial", "published_rate"])

    write_summary([str(shard)], str(plan), outputs, "w")  # nothing published: no columns
    assert not any(c.startswith("published") for c in pd.read_csv(outputs["per_suite"]).columns)
    assert "published" not in Path(outputs["markdown"]).read_text().lower()


# ------------------------------------------------------------------------------ the config


@pytest.fixture
def base_config(monkeypatch) -> dict:
    monkeypatch.chdir(REPO)
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_the_schema_fills_the_defaults_and_check_config_accepts_a_good_block(base_config):
    config = copy.deepcopy(base_config)
    config["report"] = {"published": {"libero_spatial": {"rate": 0.968, "source": "openpi"}}}
    validate_config(config)
    assert config["report"]["published_alpha"] == 0.05
    assert config["report"]["published_metric"] == "success_once"
    assert config["report"]["published"]["libero_spatial"]["n"] is None
    check_config(config)
    defaults = copy.deepcopy(base_config)
    validate_config(defaults)
    assert defaults["report"]["published"] == {}


@pytest.mark.parametrize(
    ("published", "message"),
    [
        ({"libero_spatial": {"rate": 96.8, "source": "p"}}, "96.8 is greater than the maximum"),
        ({"libero_spatial": {"rate": 0.9, "n": 0, "source": "p"}}, "0 is less than the minimum"),
        ({"libero_spatial": {"rate": 0.9, "n": 2.5, "source": "p"}}, "2.5 is not of type"),
        ({"libero_spatial": {"rate": 0.9}}, "libero_spatial.source: required but missing"),
        ({"libero_spatial": {"rate": 0.9, "source": "p", "k": 3}}, "'k' was unexpected"),
    ],
)
def test_the_schema_refuses_bad_entries(base_config, published, message):
    config = copy.deepcopy(base_config)
    config["report"] = {"published": published}
    with pytest.raises(Exception, match=message):
        validate_config(config)


def test_check_config_names_a_misspelled_suite(base_config):
    config = copy.deepcopy(base_config)
    config["report"] = {"published": {"libero_spatail": {"rate": 0.9, "source": "p"}}}
    validate_config(config)
    with pytest.raises(ConfigError, match=r"report\.published\.libero_spatail: .*libero_spatial"):
        check_config(config)


def test_check_config_names_a_blank_source():
    """What the schema cannot say (it checks rate, n and that a source is given): a source
    of blanks says nothing."""
    config = {"report": {"published": {"libero_goal": {"rate": 0.9, "source": " "}}}}
    validate_config(config)
    with pytest.raises(ValueError, match=r"report\.published\.libero_goal\.source: say where"):
        check_published_config(config["report"], ["libero_goal"])


def test_published_figures_are_not_part_of_the_rollout_fingerprint(base_config):
    from libero_eval.config import RunSettings

    config = copy.deepcopy(base_config)
    validate_config(config)
    changed = copy.deepcopy(config)
    changed["report"]["published"] = {"overall": {"rate": 0.5, "n": 10, "source": "p"}}
    changed["report"]["published_alpha"] = 0.01
    assert RunSettings(changed).fingerprint == RunSettings(config).fingerprint
    changed["rollout"]["max_steps"] = 7  # the check itself can fail
    assert RunSettings(changed).fingerprint != RunSettings(config).fingerprint


def test_the_documented_block_and_numbers_hold(base_config):
    """docs/reporting.md's example block validates and passes the config check, and its
    worked p-values are what the check computes."""
    text = (REPO / "docs" / "reporting.md").read_text()
    section = text[text.index("### Measured against published figures") :]
    block = section[section.index("```yaml\n") + 8 : section.index("```\n", 10)]
    config = copy.deepcopy(base_config)
    config.update(yaml.safe_load(block))
    validate_config(config)
    check_config(config)
    assert set(config["report"]["published"]) == {
        "libero_spatial",
        "libero_object",
        "libero_goal",
        "libero_10",
        "overall",
    }
    assert "p = 0.021 with `n: 500`, p = 5.0e-05 without" in section
    assert verdict(published_test(482, 500, 0.988, n=500)[1]) == "differs (p = 0.021)"
    assert verdict(published_test(482, 500, 0.988)[1]) == "differs (p = 5.0e-05)"
