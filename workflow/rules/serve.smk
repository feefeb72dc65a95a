def slurm_placement(server=False):
    """Slurm partition/account (and the server's GPU model) from config `slurm`; unset
    fields add nothing, so the profile's default-resources apply."""
    slurm = config["slurm"]
    placement = {
        key: slurm[field]
        for key, field in (
            ("slurm_partition", "partition"),
            ("slurm_account", "account"),
        )
        if slurm[field]
    }
    if server and slurm["gpu_model"] and config["server"]["backend"] == "sglang":
        placement["gpu_model"] = slurm["gpu_model"]
    return placement


def get_slot_runtime(wildcards, attempt):
    """Minutes of a slot job (server + shards: Snakemake takes the max in a group)."""
    minutes = config["slurm"]["runtime_min"] or config["rollout"]["runtime_min"]
    return minutes * attempt


rule serve:
    output:
        service("results/{run}/servers/slot{slot}.json"),
    log:
        "logs/{run}/serve/slot{slot}.log",
    conda:
        "../envs/libero_eval.yaml"
    threads: 0
    resources:
        **slurm_placement(server=True),
        gpu=lambda wc: 1 if config["server"]["backend"] == "sglang" else 0,
        mem_mb=config["slurm"]["server_mem_mb"],
        runtime=get_slot_runtime,
    params:
        settings=get_server_settings,
        event_log=EVENT_LOG,
        python=PYTHON,
    shell:
        "exec {params.python} -m libero_eval.servers.launch --settings {params.settings:q}"
        " --service-file {output} --event-log {params.event_log} > {log} 2>&1"
