"""Every command in the README and the user docs works as written after the Quick start, in a
shell where nothing was activated: a program of the project's virtualenv (snakemake,
libero-eval, pytest, python, ...) is called as `.venv/bin/<program>`, which must exist there;
a bare `snakemake` gave "command not found". Commands are the lines of bash code blocks (here
documents skipped) and inline code that starts with a program and has arguments."""

import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "config" / "README.md",
    REPO / "profiles" / "slurm" / "README.md",
]
VENV_BIN = Path(sys.prefix) / "bin"  # the tests run in the README's .venv
VENV_PROGRAMS = {p.name for p in VENV_BIN.iterdir()}
FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.M | re.S)
CONTROL = {"&&", "||", ";", "|", "(", ")", "&"}
# Commands that run on another machine, in its own Python (the start of the command -> where)
ELSEWHERE = {
    "python3 benchmarks/egl_memory.py --scene": "the GPU node (docs/performance.md)",
    "python3 -m snakemake --cores 40": "the GPU node, as tools/gpu/run_h200.sh runs it",
}


def shell_lines(block: str) -> list[str]:
    """A bash block's command lines: continuations joined, here-document bodies left out."""
    lines, heredoc, pending = [], None, ""
    for line in block.splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if marker := re.search(r"<<-?\s*['\"]?(\w+)", line):
            heredoc = marker.group(1)
        pending += line.rstrip("\\") + " "
        if not line.endswith("\\"):
            lines.append(pending.strip())
            pending = ""
    return [line for line in lines if line]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at && || ; |), each without leading
    `VAR=value` assignments."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: a fragment, not a command
        return []
    commands, current = [], []
    for token in [*tokens, ";"]:
        if token in CONTROL:
            while current and re.match(r"^\w+=", current[0]):
                current.pop(0)
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    return commands


def commands_in(text: str) -> list[tuple[str, list[str]]]:
    """(where, the command's words) of every command in a Markdown text."""
    found = []
    for lang, block in FENCE.findall(text):
        if lang in ("bash", "sh", "shell"):
            found += [(line, cmd) for line in shell_lines(block) for cmd in simple_commands(line)]
    prose = FENCE.sub("", text)
    for span in re.findall(r"`([^`]+)`", prose):
        for command in simple_commands(" ".join(span.split())):
            if len(command) > 1:  # a program named alone is a name, not a command
                found.append((span, command))
    return found


def problem(words: list[str]) -> str | None:
    program, args = words[0], words[1:]
    if program.startswith(".venv/bin/"):
        name = program.removeprefix(".venv/bin/")
        return None if (VENV_BIN / name).exists() else f"{program} is not in the virtualenv"
    if re.fullmatch(r"python3(\.\d+)?", program) and args[:2] == ["-m", "venv"]:
        return None  # a system interpreter making a virtualenv
    if any(" ".join(words).startswith(command) for command in ELSEWHERE):
        return None
    if program in VENV_PROGRAMS:
        return f"{program} runs only as .venv/bin/{program} (nothing activates .venv)"
    return None


def test_documents_have_commands_to_check():
    assert len(commands_in((REPO / "README.md").read_text())) >= 20
    assert all(path.is_file() for path in DOCUMENTS)


def test_every_documented_command_runs_as_written_after_the_quick_start():
    bad = [
        f"{path.relative_to(REPO)}: {where!r}: {why}"
        for path in DOCUMENTS
        for where, words in commands_in(path.read_text())
        if (why := problem(words))
    ]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_bare_and_qualified_commands():
    commands = [words for _, words in commands_in("x `snakemake --cores 2` y `snakemake`")]
    assert commands == [["snakemake", "--cores", "2"]]
    assert problem(["snakemake", "-n"]) and problem(["python", "x.py"])
    assert problem(["libero-eval", "status", "results/demo"])
    assert problem([".venv/bin/libero-eval", "status"]) is None
    assert problem([".venv/bin/no-such-program"])
    assert problem(["python3", "-m", "venv", ".venv"]) is None
    block = "```bash\ncat > a.yaml <<'EOF'\nsnakemake: 1\nEOF\n"
    block += "MUJOCO_GL=egl python x.py \\\n  --y && ls\n```\n"
    firsts = [words[0] for _, words in commands_in(block)]
    assert firsts == ["cat", "python", "ls"]
