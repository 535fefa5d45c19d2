#!/bin/sh
# The README's real-PTB comparison: 13-epoch config_small, one process and then
# 2 Horovod ranks over TCP, for each seed given, one run at a time.
#
#   scripts/real_ptb_runs.sh [DATA_DIR] [SEED ...]     (defaults: ../shared/data/ptb, seed 1234)
#
# Each run writes runs/small_{1rank,2rank}_seedN/ (train.log, metrics.jsonl,
# results.json) and runs/small_*_seedN.out. Started again after a stop, it skips
# finished runs and resumes a stopped one from its last epoch checkpoint.
set -u
cd "$(dirname "$0")/.."
data=${1:-../shared/data/ptb}
[ $# -gt 0 ] && shift
seeds=${*:-1234}
PATH=$PWD/.venv/bin:$PATH
export PATH
mkdir -p runs
for seed in $seeds; do
  for ranks in 1 2; do
    out=runs/small_${ranks}rank_seed$seed
    if [ -f "$out/results.json" ]; then
      echo "skip $out (finished)"
      continue
    fi
    resume=""
    [ -d "$out/checkpoints" ] && resume=--resume
    echo "start $out $resume $(date -u +%FT%TZ)"
    if [ "$ranks" = 1 ]; then
      python lm_ptb.py --config config_small --data_path "$data" --seed "$seed" $resume \
          --output_dir "$out" -l "$out.log" >> "$out.out" 2>&1
    else
      mpirun --allow-run-as-root -np 2 -bind-to none -map-by slot -x PATH \
          -mca pml ob1 -mca btl tcp,self -mca mpi_yield_when_idle 1 \
          python lm_ptb_distributed.py --config config_small --data_path "$data" --seed "$seed" $resume \
          --output_dir "$out" -l "$out.log" >> "$out.out" 2>&1
    fi
    echo "end $out: exit $? $(date -u +%FT%TZ)"
  done
done
