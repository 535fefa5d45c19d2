#!/bin/sh
# A pair of the README's real-PTB comparison: 13-epoch config_small in float32,
# one process and then 2 Horovod ranks over TCP, for each seed given, one run at
# a time.
#
#   scripts/real_ptb_runs.sh [DATA_DIR] [SEED ...]     (defaults: ./data/ptb, seed 1234)
#
# Each run writes runs/small_{1,2}rank_fp32_seedN/ (metrics.jsonl, results.json,
# checkpoints), its log runs/small_{1,2}rank_fp32_seedN.log and its console
# output runs/small_{1,2}rank_fp32_seedN.out; the names follow results/README.md.
# PTB is downloaded into DATA_DIR when it is not there. Started again after a
# stop, the script skips finished runs and resumes a stopped one from its last
# epoch checkpoint.
set -u
cd "$(dirname "$0")/.."
data=${1:-./data/ptb}
[ $# -gt 0 ] && shift
seeds=${*:-1234}
PATH=$PWD/.venv/bin:$PATH
export PATH
mkdir -p runs
for seed in $seeds; do
  for ranks in 1 2; do
    out=runs/small_${ranks}rank_fp32_seed$seed
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
          -mca pml ob1 -mca btl tcp,self -mca btl_tcp_disable_family 6 -mca mpi_yield_when_idle 1 \
          python lm_ptb_distributed.py --config config_small --data_path "$data" --seed "$seed" $resume \
          --output_dir "$out" -l "$out.log" >> "$out.out" 2>&1
    fi
    echo "end $out: exit $? $(date -u +%FT%TZ)"
  done
done
