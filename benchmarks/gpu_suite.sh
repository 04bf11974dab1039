#!/usr/bin/env bash
# The H200 checks in one call: worker agreement with HF and decode-step times, the throughput workload in process
# and through gRPC, then the kernel tests and benchmarks. Results go to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
for stage in ${STAGES:-worker throughput kernels}; do
  echo "== $stage $(date +%T)"
  case $stage in
    worker)
      timeout 200 python3 benchmarks/gpu_worker_check.py "$OUT/worker.json" 2>&1 | grep -v Warning | tail -12 ;;
    throughput)
      for mode in --in-process ""; do
        timeout 150 python3 -m sluice.cli --log-level WARNING bench throughput --model Qwen3-0.6B --load-format dummy \
          --dtype bfloat16 --device cuda $mode --out "$OUT/throughput${mode:+_inproc}.json" \
          2> >(tail -30 > "$OUT/throughput${mode:+_inproc}.err") | tail -2
      done ;;
    kernels)
      timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/kernels 2>&1 | tail -5 | tee "$OUT/kernel_tests.txt"
      timeout 120 python3 kernels/bench.py "$OUT/kernels.json" 2>&1 | tail -40 ;;
  esac
done
