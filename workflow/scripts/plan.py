"""Write the episode plan (one row per episode with its shard and slot)."""

from libero_eval.plan import plan_table

snakemake = snakemake  # noqa: F821 - injected by Snakemake
shards = snakemake.params.shards  # planned once, by the workflow's RunSettings
table = plan_table(shards)
table.to_csv(snakemake.output[0], index=False)
with open(snakemake.log[0], "w") as log:
    print(f"{len(table)} episodes in {len(shards)} shards", file=log)
