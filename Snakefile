# LIBERO evaluation of SGLang-served action policies:
# plan -> serve (one policy server per slot) -> rollout (sharded episodes) -> aggregate -> report.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/serve.smk"
include: "workflow/rules/rollout.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/leaderboard.smk"
include: "workflow/rules/selftest.smk"


rule all:
    default_target: True
    input:
        get_final_output(),


onstart:
    on_start()


onsuccess:
    print_summary()


onerror:
    say_if_interrupted()
