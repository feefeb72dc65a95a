rule aggregate:
    input:
        shards=get_shard_outputs,
        plan=f"results/{RUN}/plan.csv",
        dispatch=get_dispatch_logs,
    output:
        episodes=f"results/{RUN}/summary/episodes.parquet",
        per_task=f"results/{RUN}/summary/per_task.csv",
        per_suite=f"results/{RUN}/summary/per_suite.csv",
        per_seed=f"results/{RUN}/summary/per_seed.csv",
        tables=f"results/{RUN}/summary/summary.parquet",
        markdown=f"results/{RUN}/summary/summary.md",
        efficiency=f"results/{RUN}/summary/efficiency.csv",
        # the settings that define the run's episodes, for `compare` (libero_eval.analysis.compare)
        settings=f"results/{RUN}/summary/settings.json",
    log:
        f"logs/{RUN}/aggregate.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        report=config["report"],
        run_id=RUN,
        event_log=EVENT_LOG,
        service_files=get_service_files,
        serve_logs=get_serve_logs,
        recorded_settings=SETTINGS.recorded_settings,
    script:
        "../scripts/aggregate.py"
