#!/usr/bin/env bash
# The checks only a GPU can run (issue 14), prepared to spend a short device lease well. From a session with the
# device tool, after `PYTHON=.venv/bin/python bash scripts/gpu_wheelhouse.sh` here:
#   run(command="bash scripts/gpu_checks.sh all", carry=[".whl"], timeout_s=600)   # DeepSpeed <= 380 s, bench <= 180
#   (or one part per call: bash scripts/gpu_checks.sh deepspeed | bench | resume)
#   deepspeed: experiment=smoke for two iterations with trainer=deepspeed_stage2, _stage3 and gpu on tiny:gpt2,
#              then the resume check, then _stage2 and _stage3 on tiny:gpt2-124m; every saved model reloaded and
#              compared (scripts/compare_saved_models.py; ZeRO-2 is the reference). Each run stops at RUN_LIMIT_S
#              and at the part's deadline (DS_BUDGET_S under 'all'), and a section compares as soon as its runs end
#   resume:    a second uninterrupted _stage2 run (the run-to-run noise floor) and a _stage2 run whose LM
#              fine-tuning is killed at its 2nd step and run again (it must resume from its checkpoint), both
#              compared with the first run at every iteration, and each stage's output hashed per run
#   bench:     GPU decoding speed, NeuroLogic vs plain beam search (tiny:gpt2, tiny:gpt2-124m; batch 32 and 8) and
#              the --profile table (CUDA kernels, host syncs and ms per step)
# Everything lands in $OUT (runs/gpu_checks where unset): <part>.log plus JSON, 7 files (the tool returns up to 8).
# CHECK_DEVICE=cpu runs the same on a CPU (the DeepSpeed stages are then skipped: DeepSpeed refuses a CPU);
# BENCH_MODELS, BENCH_BATCHES and BENCH_REPEATS set the benchmark (default tiny:gpt2,tiny:gpt2-124m, "32 8" and 7
# rounds: a GPU batch takes 0.1-0.4 s, and on the H100 three rounds moved the ratios by up to 40 %).
set -uo pipefail
SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # 'all' runs its parts through it, after the cd below
cd "$(dirname "$SCRIPT")/.."
part=${1:-all}
OUT=${OUT:-runs/gpu_checks}
DEV=${CHECK_DEVICE:-cuda}
RUNS=${GPU_CHECKS_RUNS:-/tmp/gpu_checks_runs}  # the runs' folders (large: ZeRO checkpoints), emptied by each part
MODELS=${BENCH_MODELS:-tiny:gpt2,tiny:gpt2-124m}
mkdir -p "$OUT"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ -d .whl ] && ! "$PY" -c "import hydra, deepspeed, datasets" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the project runs from this checkout; where it is not installed, conf/ is linked in as the package i2d2._conf (what
# an editable install maps; the link is git-ignored)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import i2d2.config" 2>/dev/null || ln -sfn ../conf i2d2/_conf
"$PY" -c "import i2d2.config" || exit 1

bench() {
  local log="$OUT/bench.log" rc=0
  { nvidia-smi 2>/dev/null | head -15
    "$PY" -m pip show typing-extensions fsspec numpy 2>/dev/null | grep -E "^(Name|Version|Location)"
    "$PY" -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    for b in ${BENCH_BATCHES:-32 8}; do
      echo "== batch $b"
      "$PY" scripts/bench_decoding.py --models "$MODELS" --device "$DEV" --batch "$b" --repeats "${BENCH_REPEATS:-7}" \
        --json "$OUT/bench_b$b.json" || rc=1
    done
    echo "== --profile, batch 32"
    "$PY" scripts/bench_decoding.py --models "$MODELS" --device "$DEV" --batch 32 --profile || rc=1
  } > "$log" 2>&1
  grep -E "^(tiny|device|torch|==)|ops/step|Error" "$log"
  return $rc
}

timed() {  # run a command, then print its wall time ("<seconds> s")
  local t0=$SECONDS rc
  "$@"; rc=$?
  echo "$((SECONDS - t0)) s (exit $rc)"
  return $rc
}

train() {  # python -m i2d2.train ARGS under RUN_LIMIT_S and what is left of the part's budget (GPU_CHECKS_UNTIL,
  # epoch seconds); timeout kills the run's whole process group, and nothing outside kills this shell halfway
  local left=$(( ${GPU_CHECKS_UNTIL:-$(( $(date +%s) + 100000 ))} - $(date +%s) )) lim=${RUN_LIMIT_S:-150}
  (( left < lim )) && lim=$left
  if (( lim < 10 )); then echo "skipped, the part's time is spent: i2d2.train $*"; echo "0 s (exit 124)"; return 124; fi
  timed timeout -k 10 "$lim" "$PY" -m i2d2.train experiment=smoke iteration=0 num_iterations=2 "$@"
}

deepspeed_runs() {
  local log="$OUT/deepspeed.log" runs=$RUNS rc=0
  rm -rf "$runs"; mkdir -p "$runs"
  # the first trainer of each list is the reference of the comparison: ZeRO-3 against ZeRO-2 (both bf16 under
  # DeepSpeed), then the plain GPU fit (bf16 autocast over fp32 weights). Each section compares its models as soon
  # as its runs end, and the sections come in the order of what a short lease must answer first.
  local trainers=(deepspeed_stage2 deepspeed_stage3 gpu) big=(deepspeed_stage2 deepspeed_stage3)
  [ "$DEV" = cpu ] && trainers=(cpu) big=(cpu)
  local z=${trainers[0]} tr
  {
    for tr in "${trainers[@]}"; do
      echo "== tiny:gpt2 trainer=$tr"
      train trainer="$tr" run_dir="$runs/tiny_$tr" || rc=1
    done
    # across trainers at iteration 0 only: from iteration 1 each run fine-tunes on its own generations
    echo "== saved models reloaded, iteration 0 (reference: trainer=$z)"
    "$PY" scripts/compare_saved_models.py "${trainers[@]/#/$runs/tiny_}" --start tiny:gpt2 --iteration 0 \
      --json "$OUT/compare_tiny.json" || rc=1
    resume_runs "$runs" "$z" || rc=1
    for tr in "${big[@]}"; do
      echo "== tiny:gpt2-124m trainer=$tr"
      # a ZeRO checkpoint of the 124M model is ~1.7 GB: one at the end of each fine-tuning, not one per step
      train trainer="$tr" model.name=tiny:gpt2-124m task.finetune.ckpt_every_n_steps=1000 run_dir="$runs/124m_$tr" || rc=1
    done
    echo "== saved models reloaded, iteration 0 (reference: trainer=${big[0]})"
    "$PY" scripts/compare_saved_models.py "${big[@]/#/$runs/124m_}" --start tiny:gpt2-124m --iteration 0 \
      --json "$OUT/compare_124m.json" || rc=1
  } > "$log" 2>&1
  grep -E "^==|^   |iteration . done|params|does not load|skipped|resum|Error|^[0-9]+ s \(exit" "$log"
  return $rc
}

resume_runs() {  # <runs folder> <trainer>: the resume check and the noise floor it is read against
  local runs=$1 z=$2 rc=0 it f r h
  # the same uninterrupted run a second time: what two runs of one config differ by on this machine (GPU kernels
  # need not be bit-identical from process to process), the floor against which the resumed run below is read
  if [ ! -f "$runs/tiny_$z/iter_1/model/model.safetensors" ]; then
    echo "== tiny:gpt2 trainer=$z"; rm -rf "$runs/tiny_$z"; train trainer="$z" run_dir="$runs/tiny_$z" || rc=1
  fi
  echo "== tiny:gpt2 trainer=$z again, uninterrupted"
  train trainer="$z" run_dir="$runs/again_$z" || rc=1
  # a ZeRO fine-tuning killed after its 2nd step (before that step's checkpoint) and run again resumes from its
  # last checkpoint: compared with the run that was never killed
  echo "== tiny:gpt2 trainer=$z, the LM fine-tuning killed after its 2nd step (I2D2_FAULT_AT=train_step/finetune:2), then run again"
  I2D2_FAULT_AT=train_step/finetune:2 train trainer="$z" run_dir="$runs/resumed_$z"
  train trainer="$z" run_dir="$runs/resumed_$z" 2>&1 | tee "$runs/resumed.log"
  (( PIPESTATUS[0] == 0 )) || rc=1
  grep -q "resuming from" "$runs/resumed.log" && echo "resumed: yes" || { echo "resumed: NO (no 'resuming from')"; rc=1; }
  echo "== a second uninterrupted run and the killed-and-resumed run against the first, every iteration (the"
  echo "   second run is the noise floor: read the resumed run's differences against it)"
  "$PY" scripts/compare_saved_models.py "$runs/tiny_$z" "$runs/again_$z" "$runs/resumed_$z" --start tiny:gpt2 \
    --json "$OUT/compare_resume.json" || rc=1
  # where the runs part: the first stage output whose contents differ (the H100 lease of 2026-11-26 found the
  # resumed run's iteration 1 fine-tune off the uninterrupted runs' losses, 3.031 against 3.042, and no stage data)
  echo "== stage outputs, sha256 (first 12; '-': none) per run: first uninterrupted / second uninterrupted / resumed"
  for it in iter_0 iter_1; do
    for f in generations/generations.jsonl critic_scores/scores-rank0.npz filtered/kept.jsonl model/model.safetensors; do
      printf '   %s/%-32s' "$it" "$f"
      for r in tiny again resumed; do
        h=$(sha256sum "$runs/${r}_$z/$it/$f" 2>/dev/null | cut -c1-12)
        printf ' %-12s' "${h:--}"
      done
      echo
    done
  done
  return $rc
}

case "$part" in
  bench) bench ;;
  deepspeed) deepspeed_runs ;;
  resume)  # the resume check alone (its first trainer's runs), e.g. to repeat it
    rm -rf "$RUNS"; mkdir -p "$RUNS"
    [ "$DEV" = cpu ] && z=cpu || z=deepspeed_stage2
    resume_runs "$RUNS" "$z" > "$OUT/resume.log" 2>&1; rc=$?
    grep -E "^==|^   |params|resum|Error|skipped|destroy_process_group|^[0-9]+ s \(exit" "$OUT/resume.log"; exit $rc ;;
  # DeepSpeed first (it has never run on a GPU here), until its share of the call's limit is spent (each run stops
  # at that deadline); then the benchmark, whose process group timeout stops at its share
  all)
    GPU_CHECKS_UNTIL=$(( $(date +%s) + ${DS_BUDGET_S:-380} )) bash "$SCRIPT" deepspeed; ds=$?
    timeout -k 10 "${BENCH_BUDGET_S:-180}" bash "$SCRIPT" bench; bench=$?
    echo "gpu_checks: deepspeed exit $ds, bench exit $bench"
    exit $(( ds ? ds : bench )) ;;
  *) echo "usage: gpu_checks.sh bench|deepspeed|resume|all" >&2; exit 2 ;;
esac
