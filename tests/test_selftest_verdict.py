"""The self-test's verdict names what to check, as the run's family's part of the reference
server lists it (the registry; the self-test names no family)."""

import pandas as pd
import pytest

from libero_eval.analysis.selftest import SelfTestFailed, checks, verdict
from libero_eval.policy import families


def tables(tmp_path, rate: float):
    path = tmp_path / "tables.parquet"
    rows = [
        {"level": "overall", "suite": "all", "success_once": rate, "num_trajectories": 4},
        {"level": "suite", "suite": "libero_spatial", "success_once": rate, "num_trajectories": 4},
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_a_pass_is_one_line(tmp_path):
    assert verdict(tables(tmp_path, 1.0), 0.9, "cosmos3") == (
        "self-test passed: expert success_once 100% of 4 episodes (libero_spatial 100%)"
    )


@pytest.mark.parametrize("family", ["cosmos3", "pi05", None])
def test_a_failure_names_the_familys_checks(tmp_path, family):
    with pytest.raises(SelfTestFailed) as failed:
        verdict(tables(tmp_path, 0.0), 0.9, family)
    listed = [line[4:] for line in str(failed.value).splitlines() if line.startswith("  - ")]
    assert listed == list(checks(family))
    named = families.names() if family is None else [family]
    assert listed == [
        check for name in named for check in families.get(name).reference.selftest_checks
    ]
    assert listed  # each built-in family lists what to check


def test_every_family_is_checked_when_none_is_named():
    assert checks(None) == checks("cosmos3") + checks("pi05")
    assert "rot6d layout: the first two COLUMNS of the rotation matrix" in checks("cosmos3")
    assert not any("cosmos3" in check for check in checks("pi05"))
