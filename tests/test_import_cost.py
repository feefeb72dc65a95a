"""`workflow/rules/common.smk` imports `libero_eval.config` at parse time, before `snakemake -n`
does anything: it pulls no pandas and no scipy (they cost about a second of CPU there); the
modules that need them import them where they do."""

import subprocess
import sys

HEAVY = ("pandas", "scipy.stats", "scipy.spatial")


def test_the_config_imports_no_pandas_and_no_scipy():
    code = "import sys, libero_eval.config; print(*(m for m in sys.argv[1:] if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code, *HEAVY], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [], f"libero_eval.config imports {out.stdout.split()}"
