rule selftest:
    input:
        tables=rules.aggregate.output.tables,
    output:
        f"results/{RUN}/selftest.txt",
    log:
        f"logs/{RUN}/selftest.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        min_success_once=config["selftest"]["min_success_once"],
    script:
        "../scripts/selftest.py"
