# A training run (`checkpoints:`): each checkpoint is evaluated as a run of its own, under
# results/<run>/checkpoints/<name>/ (a single run's layout), on the run's one plan; its servers
# and shards are the single run's rules with the checkpoint's paths (`use rule`), scheduled by
# Snakemake as checkpoint x slot groups (a server and its shards), a GPU each with a GPU
# backend (`--resources gpu=N`; on Slurm, one job per checkpoint slot). Then the learning curve.

CHECKPOINT = f"results/{RUN}/checkpoints/{{checkpoint}}"
CHECKPOINT_LOGS = f"logs/{RUN}/checkpoints/{{checkpoint}}"


wildcard_constraints:
    checkpoint=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


localrules:
    checkpoint_plan,
    checkpoint_report_figures,
    checkpoint_report_efficiency,
    checkpoint_report_videos,
    checkpoint_report_robustness,
    learning_curve,


use rule plan as checkpoint_plan with:
    output:
        f"{CHECKPOINT}/plan.csv",
    log:
        f"{CHECKPOINT_LOGS}/plan.log",


use rule serve as checkpoint_serve with:
    output:
        service(f"{CHECKPOINT}/servers/slot{{slot}}.json"),
    log:
        f"{CHECKPOINT_LOGS}/serve/slot{{slot}}.log",


use rule rollout as checkpoint_rollout with:
    input:
        plan=rules.checkpoint_plan.output[0],
        server=get_server_of_shard,
    output:
        f"{CHECKPOINT}/shards/{{shard}}.parquet",
        dispatch=f"{CHECKPOINT}/shards/{{shard}}.dispatch.json",
    log:
        f"{CHECKPOINT_LOGS}/rollout/{{shard}}.log",
    params:
        checkpoint=get_checkpoint,


use rule aggregate as checkpoint_aggregate with:
    input:
        shards=get_shard_outputs,
        plan=rules.checkpoint_plan.output[0],
        dispatch=get_dispatch_logs,
    output:
        episodes=f"{CHECKPOINT}/summary/episodes.parquet",
        per_task=f"{CHECKPOINT}/summary/per_task.csv",
        per_suite=f"{CHECKPOINT}/summary/per_suite.csv",
        per_seed=f"{CHECKPOINT}/summary/per_seed.csv",
        tables=f"{CHECKPOINT}/summary/summary.parquet",
        markdown=f"{CHECKPOINT}/summary/summary.md",
        efficiency=f"{CHECKPOINT}/summary/efficiency.csv",
        settings=f"{CHECKPOINT}/summary/settings.json",
        # what it ran with (name, path, step, files' hashes, fingerprint): a later run says
        # which file changed (libero_eval.checkpoints.what_changed)
        checkpoint=f"{CHECKPOINT}/summary/checkpoint.json",
    log:
        f"{CHECKPOINT_LOGS}/aggregate.log",
    params:
        run_id=lambda wildcards: evaluated(wildcards).settings.run_id,
        event_log=get_event_log,
        checkpoint_record=get_checkpoint_record,


use rule report_figures as checkpoint_report_figures with:
    input:
        episodes=rules.checkpoint_aggregate.output.episodes,
        tables=rules.checkpoint_aggregate.output.tables,
    output:
        success_by_suite=f"{CHECKPOINT}/report/success_by_suite.png",
        success_by_task=f"{CHECKPOINT}/report/success_by_task.png",
        success_by_seed=f"{CHECKPOINT}/report/success_by_seed.png",
        success_table=f"{CHECKPOINT}/report/success_table.html",
        first_success_step=f"{CHECKPOINT}/report/first_success_step.png",
        latency_over_time=f"{CHECKPOINT}/report/latency_over_time.png",
        throughput_over_time=f"{CHECKPOINT}/report/throughput_over_time.png",
        failures_html=f"{CHECKPOINT}/report/failures_by_error.html",
        failures_csv=f"{CHECKPOINT}/report/failures_by_error.csv",
        provenance_html=f"{CHECKPOINT}/report/provenance.html",
        provenance_json=f"{CHECKPOINT}/report/provenance.json",
        overview=f"{CHECKPOINT}/report/overview.rst",
    log:
        f"{CHECKPOINT_LOGS}/report_figures.log",
    params:
        fingerprint=get_fingerprint,
        action_stats=lambda wildcards: evaluated(wildcards).settings.action_stats,
        config=lambda wildcards: evaluated(wildcards).settings.config,
        checkpoint=get_checkpoint_record,


use rule report_efficiency as checkpoint_report_efficiency with:
    input:
        efficiency=rules.checkpoint_aggregate.output.efficiency,
    output:
        html=f"{CHECKPOINT}/report/efficiency.html",
    log:
        f"{CHECKPOINT_LOGS}/report_efficiency.log",
    params:
        event_log=get_event_log,


use rule report_videos as checkpoint_report_videos with:
    input:
        episodes=rules.checkpoint_aggregate.output.episodes,
        tables=rules.checkpoint_aggregate.output.tables,
    output:
        videos=f"{CHECKPOINT}/report/videos.html",
    log:
        f"{CHECKPOINT_LOGS}/report_videos.log",
    params:
        fingerprint=get_fingerprint,
        config=lambda wildcards: evaluated(wildcards).settings.config,


use rule report_robustness as checkpoint_report_robustness with:
    input:
        episodes=rules.checkpoint_aggregate.output.episodes,
    output:
        figure=f"{CHECKPOINT}/report/robustness.png",
        html=f"{CHECKPOINT}/report/robustness.html",
        markdown=f"{CHECKPOINT}/report/robustness.md",
        csv=f"{CHECKPOINT}/report/robustness.csv",
    log:
        f"{CHECKPOINT_LOGS}/report_robustness.log",


rule learning_curve:
    input:
        unpack(get_checkpoint_summaries),
    output:
        csv=f"results/{RUN}/learning_curve/learning_curve.csv",
        markdown=f"results/{RUN}/learning_curve/learning_curve.md",
        paired=f"results/{RUN}/learning_curve/paired_tests.csv",
        figure=report(
            f"results/{RUN}/learning_curve/learning_curve.png",
            caption="../report/learning_curve.rst",
            category="Learning curve",
        ),
        html=report(
            f"results/{RUN}/learning_curve/learning_curve.html",
            caption="../report/learning_curve.rst",
            category="Learning curve",
        ),
        # the report's first screen: workflow/report/workflow.rst includes it
        overview=f"results/{RUN}/learning_curve/overview.rst",
    log:
        f"logs/{RUN}/learning_curve.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        run_id=RUN,
        names=list(CHECKPOINTS),  # in the run's order (by step)
        metric=config["compare"]["metric"],
        resamples=config["compare"]["bootstrap_resamples"],
        seed=config["compare"]["seed"],
        confidence=config["report"]["confidence_level"],
        decimals=config["report"]["decimals"],
        event_log=EVENT_LOG,
    script:
        "../scripts/learning_curve.py"
