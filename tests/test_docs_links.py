"""The docs hold together: every relative link between them resolves to a tracked file, and
every repository path docs/design.md names exists (modules move; the map must follow)."""

import importlib
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)
# dotted names design.md uses that are not modules: the entry-point group of family packages,
# and the name it explains the results package is not given
NOT_MODULES = {"libero_eval.families", "libero_eval.results"}
# where design.md's paths are relative to: the repository, the package, the families
PATH_ROOTS = ("", "src/libero_eval/", "src/libero_eval/policy/families/")


def tracked() -> set[str]:
    """Tracked (or new, not ignored) files and their folders, relative to the repository root."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = set(out.split())
    folders = {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parents) - 1)}
    return files | folders


def documents(files: set[str]) -> list[str]:
    return sorted(
        f
        for f in files
        if f.endswith(".md")
        and (f == "README.md" or f.startswith(("docs/", "config/", "profiles/", "tools/")))
    )


def broken_links(doc: str, text: str, files: set[str]) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same file
        path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
        if path not in files:
            bad.append(f"{doc}: ({target}) -> {path} does not exist")
    return bad


def test_every_link_between_the_docs_resolves():
    files = tracked()
    bad = [
        problem
        for doc in documents(files)
        for problem in broken_links(doc, (REPO / doc).read_text(), files)
    ]
    assert not bad, "\n".join(bad)


def test_every_path_and_module_design_md_names_exists():
    files = tracked()
    text = (REPO / "docs" / "design.md").read_text()
    spans = {span.rstrip("/") for span in re.findall(r"`([^`\s]+)`", text)}
    spans |= set(re.findall(r"(?<![\w/.<-])((?:src|tests|workflow|docs|config)/[\w./-]*\w)", text))
    paths = {
        s
        for s in spans
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)+", s)
        and not s.endswith("/test_")
        and any(f"{root}{s.split('/')[0]}" in files for root in PATH_ROOTS)
    }
    missing = sorted(
        path
        for path in paths
        if "<" not in path
        and not any(f"{root}{path.split('::')[0]}" in files for root in PATH_ROOTS)
    )
    modules = {s.split("::")[0] for s in spans if s.startswith("libero_eval.") and "*" not in s}
    modules -= NOT_MODULES
    unknown = sorted(name for name in modules if not resolves(name))
    assert paths and modules, "the checker found nothing to check"
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"
    assert not unknown, f"docs/design.md names modules or objects that do not exist: {unknown}"


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module of the package, or an object in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_the_checker_finds_a_broken_link():
    files = {"docs/a.md", "docs/b.md", "README.md"}
    text = "[b](b.md) [up](../README.md) [web](https://x.org/y.md) [gone](c.md#part)"
    assert broken_links("docs/a.md", text, files) == [
        "docs/a.md: (c.md#part) -> docs/c.md does not exist"
    ]


def test_the_measurements_index_lists_every_record():
    index = (REPO / "docs" / "measurements" / "README.md").read_text()
    listed = set(LINK.findall(index))
    records = [
        p.name if p.is_file() else f"{p.name}/"
        for p in (REPO / "docs" / "measurements").iterdir()
        if p.name != "README.md"
    ]
    assert records and not [r for r in records if r not in listed], listed


def test_design_md_links_every_rfc():
    text = (REPO / "docs" / "design.md").read_text()
    index = (REPO / "docs" / "rfcs" / "README.md").read_text()
    rfcs = sorted(p.name for p in (REPO / "docs" / "rfcs").glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert rfcs
    assert [r for r in rfcs if f"(rfcs/{r})" not in text] == [], "add it to design.md"
    assert [r for r in rfcs if f"({r})" not in index] == [], "add it to docs/rfcs/README.md"
