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
        family=config["policy"]["family"],
        family_modules=config["policy"]["family_modules"],
    script:
        "../scripts/selftest.py"
