localrules:
    plan,


rule plan:
    output:
        "results/{run}/plan.csv",
    log:
        "logs/{run}/plan.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        shards=SETTINGS.shards,
    script:
        "../scripts/plan.py"
