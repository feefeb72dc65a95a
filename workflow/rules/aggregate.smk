rule aggregate:
    input:
        shards=get_shard_outputs,
        plan=f"results/{RUN}/plan.csv",
    output:
        episodes=f"results/{RUN}/summary/episodes.parquet",
        per_task=f"results/{RUN}/summary/per_task.csv",
        per_suite=f"results/{RUN}/summary/per_suite.csv",
        tables=f"results/{RUN}/summary/summary.parquet",
        markdown=f"results/{RUN}/summary/summary.md",
    log:
        f"logs/{RUN}/aggregate.log",
    params:
        report=config["report"],
        run_id=RUN,
        event_log=EVENT_LOG,
    script:
        "../scripts/aggregate.py"
