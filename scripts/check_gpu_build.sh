#!/usr/bin/env bash
# make check-gpu: builds the GPU variant (make setup GPU=1) in .venv-gpu beside
# .venv and checks it on a machine without a GPU:
#   - horovodrun --check-build lists TensorFlow, MPI, Gloo and NCCL;
#   - import horovod.tensorflow resolves every symbol (LD_BIND_NOW, so a
#     function that TensorFlow no longer exports fails here, not on a GPU) and
#     hvd.nccl_built();
#   - the op selection tests (tests/test_op_selection.py, a GPU faked) pass
#     under .venv-gpu's python;
#   - the tiny config trains on the CPU in .venv-gpu to the same perplexities
#     as in .venv (make setup), bit for bit (MAX_REL).
# Prints the time, the disk used and each check's result; exits 1 if a check
# fails. Too big for make test (a venv of CUDA wheels, and Horovod built with
# NCCL the first time). The fused ops (texar_lite/kernels) are rebuilt for each
# venv in turn, so run it in a checkout where no tests run.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_VENV=.venv-gpu
OUT=output/check_gpu
# Both venvs run the same TensorFlow release, with the same oneDNN settings,
# and the same fused ops on the same CPU, and the tiny config trains
# deterministically: the two wheels' CPU kernels compute the same sums in the
# same order, so any gap means the builds differ.
MAX_REL=0

say() { printf '[check-gpu] %s\n' "$*"; }
start=$(date +%s)
rm -rf "$OUT" && mkdir -p "$OUT"

say "make setup GPU=1 into $GPU_VENV"
VENV=$GPU_VENV GPU=1 bash scripts/setup.sh

results=()
failed=0
# check NAME COMMAND...: runs COMMAND with its output in $OUT/NAME.log.
check() {
    local name=$1 log=$OUT/$1.log
    shift
    if "$@" >"$log" 2>&1; then
        results+=("PASS  $name")
    else
        results+=("FAIL  $name (log: $log)")
        failed=1
    fi
}

check_build() {
    local listing
    listing=$("$GPU_VENV/bin/horovodrun" --check-build)
    echo "$listing"
    for framework in TensorFlow MPI Gloo NCCL; do
        grep -q "\[X\] $framework" <<<"$listing" || { echo "not built with $framework"; return 1; }
    done
}

check_import() {
    LD_BIND_NOW=1 "$GPU_VENV/bin/python" -c '
import horovod.tensorflow as hvd
assert hvd.nccl_built(), "horovod built without NCCL"
hvd.init()
print("horovod.tensorflow loaded; NCCL", hvd.nccl_built(), "MPI", hvd.mpi_built(), "Gloo", hvd.gloo_built(),
      "size", hvd.size())'
}

train() {  # train VENV NAME
    CUDA_VISIBLE_DEVICES= "$1/bin/python" lm_ptb.py --config tests/config_tiny.py --data_path "$OUT/data" \
        --output_dir "$OUT/$2"
}

# Every perplexity of the two runs (each epoch's train and valid, the test's), and the largest relative gap.
compare_training() {
    .venv/bin/python - "$OUT/gpu_venv" "$OUT/cpu_venv" "$MAX_REL" <<'PY'
import json, os, sys

def perplexities(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        epochs = [json.loads(line) for line in f]
    with open(os.path.join(run, "results.json")) as f:
        test = json.load(f)["test_ppl"]
    return {**{f"epoch {m['epoch']} {k}": m[k] for m in epochs for k in ("train_ppl", "valid_ppl")}, "test_ppl": test}

gpu, cpu = perplexities(sys.argv[1]), perplexities(sys.argv[2])
assert gpu.keys() == cpu.keys(), (sorted(gpu), sorted(cpu))
worst = 0.0
for key in gpu:
    rel = abs(gpu[key] - cpu[key]) / abs(cpu[key])
    worst = max(worst, rel)
    print(f"{key}: .venv-gpu {gpu[key]!r} .venv {cpu[key]!r} relative gap {rel:.2e}")
print(f"largest relative gap {worst:.2e} (bound {sys.argv[3]})")
sys.exit(worst > float(sys.argv[3]))
PY
}

check check_build check_build
check import_horovod_tensorflow check_import
check op_selection "$GPU_VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_op_selection.py
"$GPU_VENV/bin/python" synthetic_ptb.py "$OUT/data" >/dev/null
check train_gpu_venv train "$GPU_VENV" gpu_venv

say "make setup (.venv, for the same training there)"
bash scripts/setup.sh
check train_cpu_venv train .venv cpu_venv
if [ -f "$OUT/gpu_venv/results.json" ] && [ -f "$OUT/cpu_venv/results.json" ]; then
    check same_perplexities compare_training
else
    results+=("FAIL  same_perplexities (a training run failed)")
    failed=1
fi

elapsed=$(( $(date +%s) - start ))
wheel_cache=${XDG_CACHE_HOME:-$HOME/.cache}/lm_ptb
say "time: $((elapsed / 60)) min $((elapsed % 60)) s"
say "disk: $(du -sh "$GPU_VENV" | cut -f1) in $GPU_VENV, $(du -sh "$wheel_cache" | cut -f1) in $wheel_cache (Horovod wheels)"
tail -n 1 "$OUT/same_perplexities.log" 2>/dev/null | sed 's/^/[check-gpu] same_perplexities: /' || true
for line in "${results[@]}"; do say "$line"; done
exit "$failed"
