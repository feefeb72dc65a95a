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
        plan=config["plan"],
        num_slots=config["server"]["num_slots"],
        shards_per_slot=config["rollout"]["shards_per_slot"],
    script:
        "../scripts/plan.py"
