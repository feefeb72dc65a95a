"""Fail the run when the scripted expert's success is below the self-test threshold."""

import sys

from libero_eval.analysis.selftest import SelfTestFailed, verdict
from libero_eval.policy import families

snakemake = snakemake  # noqa: F821 - injected by Snakemake
families.load_modules(snakemake.params.family_modules)  # the config's own families
try:
    params = snakemake.params
    message = verdict(snakemake.input.tables, params.min_success_once, params.family)
except SelfTestFailed as failure:
    with open(snakemake.log[0], "w") as log:
        print(failure, file=log)
    print(failure, file=sys.stderr)
    sys.exit(1)
with open(snakemake.output[0], "w") as out, open(snakemake.log[0], "w") as log:
    print(message, file=out)
    print(message, file=log)
print(message)
