"""The analysis stage: statistics over finished runs, from the episode store's tables, the
shards' dispatch logs and the serve jobs' service files and logs. Data flows plan -> serve ->
rollout -> analysis -> report; `libero_eval.report` renders what this package computes."""
