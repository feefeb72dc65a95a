localrules:
    compare,
    compare_runs,


rule compare_runs:
    input:
        unpack(get_compared_episodes),
    output:
        markdown="results/compare/{baseline}_vs_{candidate}/comparison.md",
        html=report(
            "results/compare/{baseline}_vs_{candidate}/comparison.html",
            caption="../report/comparison.rst",
            category="Comparison",
        ),
        figure=report(
            "results/compare/{baseline}_vs_{candidate}/difference.png",
            caption="../report/difference.rst",
            category="Comparison",
        ),
        per_task="results/compare/{baseline}_vs_{candidate}/per_task.csv",
        flipped="results/compare/{baseline}_vs_{candidate}/flipped.csv",
        unmatched="results/compare/{baseline}_vs_{candidate}/unmatched.csv",
    log:
        "logs/compare/{baseline}_vs_{candidate}.log",
    wildcard_constraints:
        baseline=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
        candidate=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    conda:
        "../envs/libero_eval.yaml"
    params:
        metric=config["compare"]["metric"],
        resamples=config["compare"]["bootstrap_resamples"],
        seed=config["compare"]["seed"],
        confidence=config["report"]["confidence_level"],
        allow_different_settings=config["compare"]["allow_different_settings"],
    script:
        "../scripts/compare.py"


rule compare:
    input:
        get_compare_target,
