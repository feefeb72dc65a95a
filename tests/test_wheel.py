"""The package as a wheel installs it: built (`pip wheel --no-deps`), installed non-editable
into a fresh venv and run from a directory outside the checkout, it finds its own data (the
config schema, the suites, the default statistics) and checks a shipped config.

The fresh venv has no pip and no packages of its own: the wheel goes in with the test
interpreter's pip (`--python`), offline and without dependencies, and the dependencies come
from the test interpreter's site-packages, named in a `.pth` file (a plain path line there adds
that directory alone: the checkout's editable install, a `.pth` of its own, is not read)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import json, sys
import yaml
import libero_eval
from libero_eval.config import check_config, check_family_fields, validate_config
config = yaml.safe_load(open(sys.argv[1]))
check_family_fields(config)
validate_config(config)
settings = check_config(config)
print(json.dumps({"package": libero_eval.__file__, "fingerprint": settings.fingerprint,
                  "stats": str(settings.adapter.stats.source)}))
"""


def offline_build() -> list[str]:
    """`--no-build-isolation` (offline, with the test interpreter's setuptools) where that
    setuptools builds wheels itself (>= 70.1, as the `dev` extra installs); else none: pip
    fetches the build requirements from the index (an older venv without `wheel`)."""
    try:
        import setuptools
    except ImportError:
        return []
    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2])
    return ["--no-build-isolation"] if version >= (70, 1) else []


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, **kwargs)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result


def test_the_wheel_carries_its_data_and_checks_a_shipped_config(tmp_path):
    # from a copy: setuptools builds in the source tree (build/, *.egg-info)
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source / "pyproject.toml")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", source / "src", ignore=ignore)
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", *offline_build(), "-q",
        "-w", str(wheels), str(source), cwd=tmp_path)  # fmt: skip
    (wheel,) = wheels.glob("libero_eval-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
        "--no-index", "-q", str(wheel))  # fmt: skip
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    deps = Path(sysconfig.get_paths()["purelib"])
    (Path(site.stdout.strip()) / "test_deps.pth").write_text(f"{deps}\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run(python, "-c", CHECK, str(REPO / "config" / "config.yaml"), cwd=elsewhere)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    installed = Path(site.stdout.strip())
    assert Path(found["package"]).is_relative_to(installed), found
    assert Path(found["stats"]).is_relative_to(installed / "libero_eval" / "data"), found
