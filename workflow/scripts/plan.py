"""Write the episode plan (one row per episode with its shard and slot)."""

from libero_eval.plan import make_shards, plan_episodes, plan_table

snakemake = snakemake  # noqa: F821 - injected by Snakemake
plan = snakemake.params.plan
episodes = plan_episodes(
    plan["suites"], plan["task_ids"], plan["init_state_ids"], plan["num_trials_per_task"]
)
shards = make_shards(episodes, snakemake.params.num_slots, snakemake.params.shards_per_slot)
table = plan_table(shards)
table.to_csv(snakemake.output[0], index=False)
with open(snakemake.log[0], "w") as log:
    print(f"{len(table)} episodes in {len(shards)} shards", file=log)
