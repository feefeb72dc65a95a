"""A skipped test says why, even under `pytest -q`, and a skip for a missing tool sits on the
tests that use the tool (a Chromium skip on the test above the Chromium one left the Chromium
test failing where Chromium is absent, and skipped one that never needed it)."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TOOLS = ("CHROMIUM",)  # module constants naming an optional program a test runs


def test_quiet_run_reports_each_skip_with_its_reason(tmp_path):
    (tmp_path / "test_optional.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.skipif(True, reason='the frobnicator is absent (apt-get install frob)')\n"
        "def test_needs_it():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["-c", str(REPO / "pyproject.toml"), str(tmp_path / "test_optional.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the frobnicator is absent (apt-get install frob)" in done.stdout


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _skips_for(decorators: list[ast.expr]) -> set[str]:
    """The tools whose absence these marks skip for (`pytest.mark.skipif(not TOOL...)`)."""
    found: set[str] = set()
    for mark in decorators:
        for call in ast.walk(mark):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "skipif":
                found |= _names(call) & set(TOOLS)
    return found


def tool_use_and_skips(path: Path) -> list[tuple[str, set[str], set[str], set[str]]]:
    """(test, tools it runs directly or through the module's helpers, tools the module's
    `pytestmark` skips it without, tools its own marks skip it without) for each test."""
    module = ast.parse(path.read_text())
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    module_skips: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.Assign) and "pytestmark" in _names(node):
            module_skips |= _skips_for([node.value])

    def uses(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        body = ast.Module(body=functions[name].body, type_ignores=[])
        names = _names(body)
        found = names & set(TOOLS)
        for helper in names & functions.keys() - seen - {name}:
            found |= uses(helper, seen | {name})
        return found

    return [
        (name, uses(name), module_skips, _skips_for(node.decorator_list))
        for name, node in functions.items()
        if name.startswith("test_")
    ]


def test_a_missing_tool_skips_exactly_the_tests_that_run_it():
    checked = 0
    for path in sorted(TESTS.glob("test_*.py")):
        if not set(TOOLS) & _names(ast.parse(path.read_text())):
            continue
        for test, runs, module_skips, own_skips in tool_use_and_skips(path):
            where = f"{path.relative_to(REPO)}::{test}"
            unguarded = runs - module_skips - own_skips
            assert not unguarded, f"{where} runs {unguarded} but is not skipped without it"
            assert own_skips <= runs, f"{where} is skipped without {own_skips - runs}, unused"
            checked += bool(runs)
    assert checked >= 2  # the leaderboard page and the report screenshots
