#!/usr/bin/env bash
# End to end on the one-node Slurm of .ci/slurm/setup.sh: the default evaluation through
# profiles/slurm, with shard000 made to fail once (after its first episode) so that --retries
# resubmits its slot job, which then resumes. Checks the summary, the resume and that no
# server, env worker or Slurm job is left. Run from the repository root.
set -euo pipefail

PYTHON=${PYTHON:-python}
RUN_ID=${RUN_ID:-ci_slurm}
log() { echo "[slurm-run] $*"; }

bash .ci/slurm/setup.sh

rm -rf "results/${RUN_ID}" "logs/${RUN_ID}"
marker="results/${RUN_ID}.failed_once"
rm -f "$marker"
start=$(date +%s)
# No accounting daemon on the CI node: job states come from squeue (MinJobAge=3600).
LIBERO_EVAL_FAULT="fail_shard_once=shard000:${marker}" \
    "$PYTHON" -m snakemake --profile profiles/slurm --config "run_id=${RUN_ID}" "$@" \
    --slurm-status-command squeue --slurm-init-seconds-before-status-checks 5 \
    --slurm-keep-successful-logs
log "snakemake finished in $(( $(date +%s) - start )) s"

fail() { log "FAILED: $*"; exit 1; }
[ -f "$marker" ] || fail "the injected failure of shard000 did not happen"
grep -q "shard000: injected failure (fail_shard_once" "logs/${RUN_ID}/eval_embodiment.log" \
    || fail "the event log does not show the injected failure of shard000"
grep -Eq "shard000 .*\(([0-9]+) to run, [1-9][0-9]* already finished" \
    "logs/${RUN_ID}/eval_embodiment.log" \
    || fail "the resubmitted shard000 did not resume from finished episodes"
"$PYTHON" - "$RUN_ID" <<'PY'
import sys
import pandas as pd
run = sys.argv[1]
episodes = pd.read_parquet(f"results/{run}/summary/episodes.parquet")
plan = pd.read_csv(f"results/{run}/plan.csv")
assert len(episodes) == len(plan), (len(episodes), len(plan))
assert episodes["error"].isna().all(), episodes["error"].dropna().tolist()
print(open(f"results/{run}/summary/summary.md").read())
PY
queued=$(squeue -h -u "$(id -un)" -t PENDING,RUNNING,COMPLETING -o %i | wc -l)
[ "$queued" -eq 0 ] || fail "$queued Slurm job(s) still queued or running"
# Processes this run's Slurm jobs left: ours carry SLURM_JOB_ID in their environment (other
# processes on the machine, e.g. tests running beside this one, do not).
left=""
for pid in $( (pgrep libero-env; pgrep -f "libero_eval.(serve|reference)|${RUN_ID}") || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q '^SLURM_JOB_ID='; then
        left+="$(ps -o pid=,args= -p "$pid" || true)"$'\n'
    fi
done
[ -z "$left" ] || fail "processes left behind: $left"
log "Slurm end-to-end run passed: $(squeue -h -t all -o '%i %j %T %M' | wc -l) Slurm job(s)"
squeue -t all -o "%.8i %.40j %.10T %.10M %R"
