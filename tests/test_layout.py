"""The package's imports flow one way (docs/design.md): no import circles, and the rollout side
imports nothing of the server side (what both need lives in `libero_eval.service`)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "libero_eval"


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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in graph[stack.pop()] - seen:
            seen.add(nxt)
            stack.append(nxt)
    return seen


def test_no_module_imports_one_that_imports_it_back():
    graph = imports()
    circles = sorted(m for m in graph if m in reachable(graph, m))
    assert circles == [], f"modules on an import circle: {circles}"


def test_the_rollout_side_imports_nothing_of_the_server_side():
    graph = imports()
    rollout = [m for m in graph if m.startswith("libero_eval.rollout")]
    reached = set().union(*(reachable(graph, m) for m in rollout))
    assert not {m for m in reached if m.startswith(("libero_eval.serve", "libero_eval.reference"))}


MAX_LINES = 600
SIZE_REASON = "Size:"  # a module over MAX_LINES says why in its docstring, after this word


def test_no_source_file_is_over_600_lines_without_a_reason_at_its_top():
    oversized = {
        module_name(path): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
        if len(path.read_text().splitlines()) > MAX_LINES
        and SIZE_REASON not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    }
    assert oversized == {}, f"split these modules, or say why not ({SIZE_REASON!r}): {oversized}"
