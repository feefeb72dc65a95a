localrules:
    leaderboard,


rule leaderboard:
    input:
        get_leaderboard_summaries,
    output:
        markdown="results/leaderboard/leaderboard.md",
        csv="results/leaderboard/leaderboard.csv",
        html=report(
            "results/leaderboard/leaderboard.html",
            caption="../report/leaderboard.rst",
            category="Leaderboard",
        ),
    log:
        "logs/leaderboard.log",
    conda:
        "../envs/libero_eval.yaml"
    script:
        "../scripts/leaderboard.py"
