localrules:
    report_figures,
    report_efficiency,
    report_videos,
    report_robustness,


rule report_figures:
    input:
        episodes=rules.aggregate.output.episodes,
        tables=rules.aggregate.output.tables,
    output:
        success_by_suite=report(
            f"results/{RUN}/report/success_by_suite.png",
            caption="../report/success_by_suite.rst",
            category="Success",
            subcategory="Charts",
        ),
        success_by_task=report(
            f"results/{RUN}/report/success_by_task.png",
            caption="../report/success_by_task.rst",
            category="Success",
            subcategory="Charts",
        ),
        success_by_seed=report(
            f"results/{RUN}/report/success_by_seed.png",
            caption="../report/success_by_seed.rst",
            category="Success",
            subcategory="Charts",
        ),
        success_table=report(
            f"results/{RUN}/report/success_table.html",
            caption="../report/success_table.rst",
            category="Success",
            subcategory="Tables",
        ),
        first_success_step=report(
            f"results/{RUN}/report/first_success_step.png",
            caption="../report/first_success_step.rst",
            category="Success",
            subcategory="Charts",
        ),
        latency_over_time=report(
            f"results/{RUN}/report/latency_over_time.png",
            caption="../report/latency_over_time.rst",
            category="Performance",
        ),
        throughput_over_time=report(
            f"results/{RUN}/report/throughput_over_time.png",
            caption="../report/throughput_over_time.rst",
            category="Performance",
        ),
        failures_html=report(
            f"results/{RUN}/report/failures_by_error.html",
            caption="../report/failures_by_error.rst",
            category="Failures",
        ),
        failures_csv=f"results/{RUN}/report/failures_by_error.csv",
        provenance_html=report(
            f"results/{RUN}/report/provenance.html",
            caption="../report/provenance.rst",
            category="Provenance",
        ),
        provenance_json=f"results/{RUN}/report/provenance.json",
        # the report's first screen: workflow/report/workflow.rst includes it
        overview=f"results/{RUN}/report/overview.rst",
    log:
        f"logs/{RUN}/report_figures.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        report=config["report"],
        fingerprint=FINGERPRINT,
        action_stats=ACTION_STATS,
        repo_dir=workflow.basedir,
    script:
        "../scripts/report_figures.py"


rule report_efficiency:
    input:
        efficiency=rules.aggregate.output.efficiency,
    output:
        html=report(
            f"results/{RUN}/report/efficiency.html",
            caption="../report/efficiency.rst",
            category="Performance",
        ),
    log:
        f"logs/{RUN}/report_efficiency.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        event_log=EVENT_LOG,
    script:
        "../scripts/report_efficiency.py"


rule report_videos:
    input:
        episodes=rules.aggregate.output.episodes,
        tables=rules.aggregate.output.tables,
    output:
        videos=report(
            f"results/{RUN}/report/videos.html",
            caption="../report/videos.rst",
            category="Episode videos",
        ),
    log:
        f"logs/{RUN}/report_videos.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        report=config["report"],
        fingerprint=FINGERPRINT,
        repo_dir=workflow.basedir,
    script:
        "../scripts/report_figures.py"


rule report_robustness:
    input:
        episodes=rules.aggregate.output.episodes,
    output:
        figure=report(
            f"results/{RUN}/report/robustness.png",
            caption="../report/robustness.rst",
            category="Robustness",
        ),
        html=report(
            f"results/{RUN}/report/robustness.html",
            caption="../report/robustness.rst",
            category="Robustness",
        ),
        markdown=f"results/{RUN}/report/robustness.md",
        csv=f"results/{RUN}/report/robustness.csv",
    log:
        f"logs/{RUN}/report_robustness.log",
    conda:
        "../envs/libero_eval.yaml"
    params:
        metric=config["compare"]["metric"],
        resamples=config["compare"]["bootstrap_resamples"],
        seed=config["compare"]["seed"],
        confidence=config["report"]["confidence_level"],
    script:
        "../scripts/robustness.py"
