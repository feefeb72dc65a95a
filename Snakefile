# LIBERO evaluation of SGLang-served action policies:
# plan -> serve (one policy server per slot) -> rollout (sharded episodes) -> aggregate -> report.
from snakemake.utils import min_version

min_version("9.0")


# The demo (config/config.yaml) only when no --configfile is given. Snakemake overlays
# --configfile on the Snakefile's `configfile:` (snakemake/workflow.py, Workflow.configfile:
# the command line's config is merged after each file it loads), so a user's config would
# inherit the demo's plan; with --configfile the config starts from the schema's defaults.
# Jobs Snakemake spawns get the same --configfiles (spawn_jobs.py, get_configfiles_arg).
if not workflow.overwrite_configfiles:

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
include: "workflow/rules/checkpoints.smk"


rule all:
    default_target: True
    input:
        get_final_output(),


onstart:
    on_start()


onsuccess:
    record_end(EVENT_LOG)
    print_summary()


onerror:
    say_if_interrupted()
