"""Contract tests against SGLang 0.5.23's own code, run in a side environment.

SGLang needs torch and its own pins, so it lives in its own virtualenv (CPU torch; made by
``bash tests/sglang_side/install.sh``, ``.venv-sglang`` by default). :class:`SglangSide` starts
``worker.py`` there once per test session and calls SGLang's functions through it. Tests that
need it skip when the side environment is missing, unless ``LIBERO_EVAL_REQUIRE_SGLANG=1``
(CI), where a missing environment is an error.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
INSTALL_HINT = "bash tests/sglang_side/install.sh (makes .venv-sglang)"


class SglangSideError(RuntimeError):
    """The side worker failed in a way that is not SGLang rejecting the input."""


class SglangValueError(ValueError):
    """SGLang raised ValueError: its HTTP handler answers 400 with this message."""


def side_python() -> Path | None:
    """The side environment's python: $LIBERO_EVAL_SGLANG_PYTHON, else .venv-sglang."""
    configured = os.environ.get("LIBERO_EVAL_SGLANG_PYTHON")
    path = Path(configured) if configured else REPO_ROOT / ".venv-sglang" / "bin" / "python"
    return path if path.is_file() else None


class SglangSide:
    """One worker process in the side environment, answering one call at a time."""

    def __init__(self, python: Path):
        self.process = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        hello = self._read()
        if not hello or not hello.get("ready"):
            raise SglangSideError(f"SGLang side worker did not start with {python}")

    def _read(self) -> dict[str, Any] | None:
        header = self.process.stdout.read(4)
        if len(header) < 4:
            return None
        (size,) = struct.unpack(">I", header)
        return msgpack.unpackb(self.process.stdout.read(size), raw=False)

    def call(self, op: str, **args: Any) -> Any:
        data = msgpack.packb({"op": op, "args": args}, use_bin_type=True)
        self.process.stdin.write(struct.pack(">I", len(data)) + data)
        self.process.stdin.flush()
        answer = self._read()
        if answer is None:
            raise SglangSideError(f"SGLang side worker died during {op}")
        if answer["ok"]:
            return answer["result"]
        if "value_error" in answer:
            raise SglangValueError(answer["value_error"])
        raise SglangSideError(answer["error"])

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_or_skip() -> SglangSide:
    import pytest

    python = side_python()
    if python is None:
        if os.environ.get("LIBERO_EVAL_REQUIRE_SGLANG") == "1":
            raise SglangSideError(
                f"LIBERO_EVAL_REQUIRE_SGLANG=1 but no SGLang side environment: run {INSTALL_HINT}"
            )
        pytest.skip(f"SGLang 0.5.23 side environment not installed; run {INSTALL_HINT}")
    print(f"SGLang side worker: {python}", file=sys.stderr)
    return SglangSide(python)
