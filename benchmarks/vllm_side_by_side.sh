#!/usr/bin/env bash
# Sluice beside vLLM 0.26 on one lent GPU (issue 54): the same requests, written by `sluice bench write-workload`, given
# to Sluice in process and through gRPC and to vLLM's offline engine (../shared/tools/vllm-anchor). Run from the
# repository root on the device, one call after another while the machine stays warm:
#   benchmarks/vllm_side_by_side.sh CALL    runs PLAN[CALL]; JOBS="engine:row ..." runs those jobs instead
# engine: inproc or grpc (Sluice), vllm. Carried: .whl/ (Sluice and its deps; installed into /tmp/site, kept while
# warm), .vllm/cN (vLLM's part N, copied to /tmp/vllm-parts) and, from the third call on, .vllm/anchor (a copy of
# vllm-anchor/). vLLM installs at its first job, once every part is there. A job that would not end by LIMIT seconds
# (default 540) by its estimate is left for a later call and listed in $OUT/left.txt. Results: $OUT/ENGINE_ROW.json,
# $OUT/host_CALL.json, logs under $OUT/logs; the table: benchmarks/side_by_side_table.py.
set -uo pipefail
call=${1:?usage: vllm_side_by_side.sh CALL}
OUT=${OUT:-side_by_side_out}
LIMIT=${LIMIT:-540}
WORKLOADS_DIR=/tmp/side_by_side
mkdir -p "$OUT/logs" "$WORKLOADS_DIR" /tmp/vllm-parts
FP8="--quantization fp8 --kv-cache-dtype fp8"
SAMPLED="--temperature 0.8 --top-p 0.95 --top-k 50"
PENALTIES="--temperature 0.7 --repetition-penalty 1.1 --frequency-penalty 0.2 --logprobs 5"
declare -A ROWS=(  # seconds a job is expected to take, model, workload (- for batch 1), flags of both engines
  [qwen3-0.6b-standard]="60 Qwen3-0.6B standard"
  [qwen3-0.6b-sampled]="60 Qwen3-0.6B standard $SAMPLED"
  [qwen3-0.6b-penalties-logprobs]="70 Qwen3-0.6B standard $PENALTIES"
  [qwen3-0.6b-nano-vllm]="60 Qwen3-0.6B nano-vllm --temperature 0.6"
  [llama-3.1-8b-400x1000-bf16]="170 Llama-3.1-8B llama-400x1000 --max-num-seqs 512"
  [llama-3.1-8b-400x1000-fp8]="150 Llama-3.1-8B llama-400x1000 --max-num-seqs 512 $FP8"
  [qwen3-0.6b-batch1-bf16]="45 Qwen3-0.6B -"
  [qwen3-0.6b-batch1-fp8]="45 Qwen3-0.6B - $FP8"
  [llama-3.1-8b-batch1-bf16]="80 Llama-3.1-8B -"
  [llama-3.1-8b-batch1-fp8]="80 Llama-3.1-8B - $FP8"
)
declare -A WORKLOADS=(  # `sluice bench write-workload` flags
  [standard]=""
  [nano-vllm]="--generator nano-vllm"
  [llama-400x1000]="--num-requests 400 --input-len 1000 1000 --output-len 1000 1000 --vocab-size 128256"
)
both() { for row in "$@"; do echo "inproc:$row grpc:$row"; done; }
PLAN=(  # vLLM's jobs from the third call on, when its last part has come; about 400 s a call
  [1]="$(both qwen3-0.6b-standard qwen3-0.6b-sampled qwen3-0.6b-penalties-logprobs qwen3-0.6b-nano-vllm \
         llama-3.1-8b-batch1-bf16)"
  [2]="$(both llama-3.1-8b-400x1000-bf16 qwen3-0.6b-batch1-bf16 qwen3-0.6b-batch1-fp8)"
  [3]="vllm:qwen3-0.6b-standard vllm:qwen3-0.6b-sampled vllm:qwen3-0.6b-penalties-logprobs vllm:qwen3-0.6b-nano-vllm
       vllm:qwen3-0.6b-batch1-bf16 vllm:qwen3-0.6b-batch1-fp8"
  [4]="$(both llama-3.1-8b-400x1000-fp8) vllm:llama-3.1-8b-batch1-bf16 vllm:llama-3.1-8b-batch1-fp8"
  [5]="vllm:llama-3.1-8b-400x1000-bf16 vllm:llama-3.1-8b-400x1000-fp8 $(both llama-3.1-8b-batch1-fp8)"
)

export PYTHONPATH=/tmp/site PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v WARNING
fi
for part in .vllm/c*/; do [ -d "$part" ] && cp "$part"* /tmp/vllm-parts/; done
[ -d .vllm/anchor ] && rm -rf /tmp/vllm-anchor && cp -r .vllm/anchor /tmp/vllm-anchor

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
loop_s=$(python3 -c 'import time; t = time.perf_counter(); sum(i * i for i in range(3_000_000))
print(round(time.perf_counter() - t, 3))')
echo "{\"call\": $call, \"gpu\": \"$gpu\", \"host_loop_s\": $loop_s}" | tee "$OUT/host_$call.json"

workload_file() {  # name -> the file, written on the first call that needs it
  local file=$WORKLOADS_DIR/$1.json
  [ -f "$file" ] || python3 -m sluice.cli bench write-workload "$file" ${WORKLOADS[$1]} >&2
  echo "$file"
}

run_job() {  # engine:row, within the seconds given
  local engine=${1%%:*} row=${1#*:} seconds=$2 need model workload flags
  read -r need model workload flags <<< "${ROWS[$row]}"
  local source=(--latency) kind=latency
  [ "$workload" = - ] || { kind=throughput; source=(--workload "$(workload_file "$workload")"); }
  local out=$OUT/${engine}_$row.json
  if [ "$engine" = vllm ]; then
    timeout "$seconds" /tmp/vllm-anchor/device.sh --model "$model" "${source[@]}" $flags --out "$out"
  else
    [ "$kind" = latency ] && source=()
    local mode=(); [ "$engine" = inproc ] && mode=(--in-process)
    timeout "$seconds" python3 -m sluice.cli --log-level WARNING bench $kind --model "$model" --load-format dummy \
      --dtype bfloat16 --device cuda "${mode[@]}" "${source[@]}" $flags --out "$out"
  fi
}

left=()
for job in ${JOBS:-${PLAN[$call]}}; do
  [ -n "${ROWS[${job#*:}]:-}" ] || { echo "no row ${job#*:}"; continue; }
  need=${ROWS[${job#*:}]%% *}
  if (( SECONDS + need > LIMIT )); then left+=("$job"); continue; fi
  echo "== $job $(date +%T)"
  log=$OUT/logs/${job/:/_}.log
  run_job "$job" $(( LIMIT - SECONDS )) > "$log" 2>&1
  echo "rc $?, $SECONDS s into the call"; grep -v -e Warning -e WARNING "$log" | tail -3
done
if (( ${#left[@]} )); then
  printf '%s\n' "${left[@]}" > "$OUT/left.txt"
  echo "left for a later call: JOBS=\"${left[*]}\""
fi
