"""Fail the run when the scripted expert's success is below the self-test threshold."""

import sys

from libero_eval.analysis.selftest import SelfTestFailed, verdict

snakemake = snakemake  # noqa: F821 - injected by Snakemake
try:
    message = verdict(snakemake.input.tables, snakemake.params.min_success_once)
except SelfTestFailed as failure:
    with open(snakemake.log[0], "w") as log:
        print(failure, file=log)
    print(failure, file=sys.stderr)
    sys.exit(1)
with open(snakemake.output[0], "w") as out, open(snakemake.log[0], "w") as log:
    print(message, file=out)
    print(message, file=log)
print(message)
