rule rollout:
    input:
        plan=rules.plan.output[0],
        server=get_server_of_shard,
    output:
        "results/{run}/shards/{shard}.parquet",
        dispatch="results/{run}/shards/{shard}.dispatch.json",
    log:
        "logs/{run}/rollout/{shard}.log",
    conda:
        "../envs/libero_eval.yaml"
    threads: get_envs_per_shard
    resources:
        **slurm_placement(),
        mem_mb=lambda wc, attempt: get_envs_per_shard()
        * config["rollout"]["mem_mb_per_env"]
        * attempt,
        runtime=lambda wc, attempt: config["rollout"]["runtime_min"] * attempt,
    params:
        fingerprint=get_fingerprint,
        store=get_store,
        service_file=get_service_file_of_shard,
        serve_log=get_serve_log_of_shard,
        event_log=get_event_log,
        video_dir=get_video_dir,
    script:
        "../scripts/rollout.py"
