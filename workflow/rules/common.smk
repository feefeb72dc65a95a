import json
import sys
from pathlib import Path

from snakemake.utils import validate

from libero_eval import settings as eval_settings
from libero_eval.store import EpisodeStore

validate(config, schema="../../config/schema.yaml")
try:
    eval_settings.check_config(config)
except eval_settings.ConfigError as error:
    raise WorkflowError(f"Invalid config: {error}")

RUN = config["run_id"]
PYTHON = sys.executable
SHARDS = {shard.name: shard for shard in eval_settings.shards(config)}
SLOTS = sorted({shard.slot for shard in SHARDS.values()})
FINGERPRINT = eval_settings.rollout_fingerprint(config)
EVENT_LOG = f"logs/{RUN}/eval_embodiment.log"
STORE = EpisodeStore(f"results/{RUN}/episodes/{FINGERPRINT}")


wildcard_constraints:
    run=RUN,
    shard=r"shard\d{3}",
    slot=r"\d+",


def get_final_output():
    return rules.aggregate.output


def get_shard_outputs(wildcards):
    return expand("results/{run}/shards/{shard}.parquet", run=RUN, shard=sorted(SHARDS))


def get_server_of_shard(wildcards):
    """The slot's service, only while some of the shard's episodes are unfinished.

    A service output always counts as missing; consuming it unconditionally would rerun
    every finished shard. A finished shard is rebuilt from the episode store without a server.
    """
    shard = SHARDS[wildcards.shard]
    if len(STORE.finished(shard.episodes)) == len(shard.episodes):
        return []
    return f"results/{RUN}/servers/slot{shard.slot}.json"


def get_shard_episodes(wildcards):
    """The shard's episodes as [suite, task, init] triples (a rerun trigger when they change)."""
    return [
        [e.suite, e.task_id, e.init_state_id] for e in SHARDS[wildcards.shard].episodes
    ]


def get_server_settings(wildcards):
    return json.dumps(eval_settings.server_settings(config, int(wildcards.slot)))


def get_envs_per_shard(wildcards=None):
    return eval_settings.envs_per_shard(config)


def print_summary():
    summary = Path(f"results/{RUN}/summary/summary.md")
    if summary.exists():
        print(f"\n{summary.read_text()}")
