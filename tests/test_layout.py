"""The package's imports flow one way (docs/design.md, "Layers"): no import circles, every module
in a declared layer and importing nothing of a higher one (so nothing of `libero_eval.rollout`
imports `libero_eval.config`), and the rollout side imports nothing of the server side (what
both need lives in `libero_eval.service`). Every import counts: lazy ones inside functions and
those under `if TYPE_CHECKING:` too."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = SRC / "libero_eval"

# Lowest first. A module may import from its own layer and the layers below it, never from one
# above. Each name is `libero_eval.<name>` and everything under it; "libero_eval" alone is the
# package's `__init__`.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "libero_eval",
            "package_data",
            "settings_schema",
            "suites",
            "eventlog",
            "faults",
            "failures",
            "service",
            "interrupt",
            "checkpoint_identity",
        ),
    ),
    ("episodes", ("plan", "store")),
    ("policy", ("policy",)),
    # The two sides of a run: the rollout side (`rollout`) and the server side (`serve`,
    # `reference`); neither imports the other (test below), both get settings built above.
    ("jobs", ("rollout", "serve", "reference")),
    ("config", ("config_layout", "config_server", "config_rules", "checkpoints", "config")),
    ("analysis", ("analysis",)),
    ("report", ("report",)),
    ("commands", ("cli", "schema_doc", "watch")),
)

# The families (`libero_eval.policy.families.<name>`, both sides of the wire: the client's adapter
# and their part of the reference server) are in the policy layer; the server side imports
# nothing of them but the registry (docs/rfcs/0009-family-plug-ins.md).
FAMILIES = "libero_eval.policy.families"
SERVER_SIDE = ("libero_eval.serve", "libero_eval.reference")
# What reaches a family through the registry alone, by the name in the config.
FAMILY_BLIND = (
    "libero_eval.config",
    "libero_eval.config_layout",
    "libero_eval.config_rules",
    "libero_eval.config_server",
    "libero_eval.reference",
    "libero_eval.serve",
    "libero_eval.rollout",
    "libero_eval.report",
    "libero_eval.analysis.selftest",
)


# Imports that break a rule, as (importer, imported): none. An entry here must name an import
# that still exists (test below), so a tolerated exception cannot outlive its cause.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module -> the libero_eval modules it imports (lazily inside functions too)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("libero_eval"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("libero_eval"))
        graph[name] = found & modules.keys()
    return graph


def without_known_violations(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {x for x in deps if (m, x) not in KNOWN_VIOLATIONS} for m, deps in graph.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in graph[stack.pop()] - seen:
            seen.add(nxt)
            stack.append(nxt)
    return seen


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a libero_eval module's layer; None when it has none."""
    parts = module.split(".")
    top = parts[0] if len(parts) == 1 else parts[1]
    return next((i for i, (_, names) in enumerate(LAYERS) if top in names), None)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above the importer's."""
    found = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} ({LAYERS[own][0]}) imports {dep} ({LAYERS[theirs][0]})")
    return found


def test_no_module_imports_one_that_imports_it_back():
    graph = imports()
    circles = sorted(m for m in graph if m in reachable(graph, m))
    assert circles == [], f"modules on an import circle: {circles}"


def test_every_module_is_in_a_layer():
    unplaced = sorted(m for m in imports() if layer_of(m) is None)
    assert unplaced == [], f"put these in LAYERS (and docs/design.md, 'Layers'): {unplaced}"


def test_no_module_imports_from_a_higher_layer():
    violations = layer_violations(without_known_violations(imports()))
    assert violations == [], "imports against the layer order:\n" + "\n".join(violations)


def test_the_layer_check_catches_an_import_from_above():
    graph = {"libero_eval.rollout.runner": {"libero_eval.config"}, "libero_eval.config": set()}
    assert layer_violations(graph) == [
        "libero_eval.rollout.runner (jobs) imports libero_eval.config (config)"
    ]


def test_nothing_of_the_rollout_side_reaches_the_config():
    graph = without_known_violations(imports())
    rollout = [m for m in graph if m.startswith("libero_eval.rollout")]
    reaching = sorted(m for m in rollout if "libero_eval.config" in reachable(graph, m))
    assert reaching == [], f"these rollout modules import libero_eval.config: {reaching}"


def test_nothing_of_the_policy_side_imports_the_server_side():
    """A family's part of the reference server gets what it needs handed to it
    (`libero_eval.policy.reference_host`): nothing under `policy/` imports the server."""
    graph = imports()
    policy = [m for m in graph if m.startswith("libero_eval.policy")]
    found = sorted(f"{m} -> {d}" for m in policy for d in graph[m] if d.startswith(SERVER_SIDE))
    assert found == [], f"the policy side imports the server side: {found}"


def test_the_core_reaches_a_family_only_through_the_registry():
    """The reference server, the jobs, the config, the report and the self-test name no
    family: they import the registry (`libero_eval.policy.families`), never a family's module,
    and ask it by the name the config gives."""
    graph = imports()
    found = sorted(
        f"{m} -> {d}"
        for m in graph
        if m.startswith(FAMILY_BLIND)
        for d in graph[m]
        if d.startswith(FAMILIES + ".") and d.count(".") >= 3
    )
    assert found == [], f"these import a family's module, not the registry: {found}"


def test_every_known_violation_is_still_there():
    graph = imports()
    gone = sorted(edge for edge in KNOWN_VIOLATIONS if edge[1] not in graph.get(edge[0], set()))
    assert gone == [], f"these imports are gone: take them out of KNOWN_VIOLATIONS: {gone}"


def test_the_rollout_side_imports_nothing_of_the_server_side():
    graph = imports()
    rollout = [m for m in graph if m.startswith("libero_eval.rollout")]
    reached = set().union(*(reachable(graph, m) for m in rollout))
    assert not {m for m in reached if m.startswith(SERVER_SIDE)}


MAX_LINES = 600
SIZE_REASON = "Size:"  # a module over MAX_LINES says why in its docstring, after this word
SIZED = ("src", "benchmarks", "tools", "workflow")  # every Python file under these


def test_no_python_file_is_over_600_lines_without_a_reason_at_its_top():
    oversized = {}
    for folder in SIZED:
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text()
            lines = len(text.splitlines())
            if lines > MAX_LINES and SIZE_REASON not in (ast.get_docstring(ast.parse(text)) or ""):
                oversized[str(path.relative_to(REPO))] = lines
    assert oversized == {}, f"split these files, or say why not ({SIZE_REASON!r}): {oversized}"
