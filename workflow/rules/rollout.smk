rule rollout:
    input:
        server=get_server_of_shard,
    output:
        "results/{run}/shards/{shard}.parquet",
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
        episodes=get_shard_episodes,
        fingerprint=FINGERPRINT,
        store=STORE.root,
        slot=lambda wc: SHARDS[wc.shard].slot,
        event_log=EVENT_LOG,
    script:
        "../scripts/rollout.py"
