#!/usr/bin/env bash
# Prints the instruction-set flags (as /proc/cpuinfo names them) that
# scripts/setup.sh builds the suite's kernels for: the widest set this CPU
# has of AVX-512 (F, BW, DQ, VL) with AVX2 and FMA, then AVX2 with FMA, else
# nothing (the compiler's baseline). The argument is the cpuinfo file to
# read, /proc/cpuinfo by default. g++ takes each flag as -m<flag>.
set -euo pipefail
flags=" $( { grep -m1 '^flags' "${1:-/proc/cpuinfo}" 2>/dev/null || true; } | cut -d: -f2) "
has() { for flag; do [[ "$flags" == *" $flag "* ]] || return 1; done; }
for isa in "avx512f avx512bw avx512dq avx512vl avx2 fma" "avx2 fma"; do
    # shellcheck disable=SC2086 # the set is split into its flags on purpose
    if has $isa; then echo "$isa"; exit 0; fi
done
echo
