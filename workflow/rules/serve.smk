rule serve:
    output:
        service("results/{run}/servers/slot{slot}.json"),
    log:
        "logs/{run}/serve/slot{slot}.log",
    conda:
        "../envs/libero_eval.yaml"
    # 0: a service's resources add up with its consumers'. Snakemake then exports
    # OMP_NUM_THREADS=0; the launcher gives the server a positive count (serve/command.py).
    threads: 0
    resources:
        **slurm_placement(server=True),
        gpu=1 if SETTINGS.server_on_gpu else 0,
        mem_mb=config["slurm"]["server_mem_mb"],
        runtime=get_slot_runtime,
    params:
        settings=get_server_settings,
        capacity_probe=get_capacity_probe,
        event_log=get_event_log,
        python=PYTHON,
        gpu_pool=get_gpu_pool_args,
    shell:
        "exec {params.python} -m libero_eval.serve.job --settings {params.settings:q}"
        " --capacity-probe {params.capacity_probe:q} --service-file {output}"
        " --event-log {params.event_log} {params.gpu_pool} > {log} 2>&1"
