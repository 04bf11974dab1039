#!/usr/bin/env bash
# The H200 checks in one call; STAGES picks some (default: all). Results go to $OUT (or ./gpu_out).
#   agreement   greedy agreement with HF transformers on random weights (benchmarks/gpu_agreement.py)
#   worker      one decode step of Qwen3-0.6B at batch 1 and 256, eager and with CUDA graphs; graph decode against
#               eager decode, token for token (tests/worker/test_decode_graphs.py)
#   profile     the throughput workload step by step, with torch.profiler windows (benchmarks/gpu_step_profile.py)
#   throughput  the standard workload in process and through the gRPC stack
#   latency     batch-1 time per output token, Qwen3-0.6B and Llama-3.1-8B, in process and through gRPC
#   serve       8 req/s of 1k in / 256 out on Llama-3.1-8B against `sluice serve`
#   serve16     16 req/s of the same at a 512-token budget, bf16 then FP8 weights and KV cache
#   sampling    the sampling tests on the GPU (its kernels against the torch path), the sampling step alone at 256 x
#               151,936, and the standard workload greedy and sampled through gRPC
#   kernels     the kernel tests and benchmarks
#   vl          Qwen2.5-VL-7B through gRPC, 256 requests of one 448 x 448 image and 100 text tokens in / 128 out, then
#               the same text only; with images it reports the prompt tokens (template and placeholders too) and the
#               vision encoder's share of the worker's step time
#   warmup      no request pays for a compile: the sampler warm-up's tests (no step compiles after it), then each
#               sampling variant's first request on a stack with an empty compile cache against a stack on the warm
#               cache, with both start-ups and the warm-up in them (benchmarks/first_request.py)
#   linear      small-batch linear layers: a launch-config sweep, and fused against unfused (benchmarks/kernel_linear.py)
#   fp8linear   the same sweep over FP8 weights (Llama-3.1-8B)
#   fp8rows     Llama-3.1-8B's FP8 GEMMs by row count, as they are against padded (benchmarks/scaled_mm_rows.py)
#   fp8kernels  Llama-3.1-8B's FP8 row kernels by row count, and decode attention over an FP8 cache as the decode
#               graphs launch it against one row a program (benchmarks/fp8_kernels.py)
#   fp8latency  Llama-3.1-8B batch 1, bf16 against FP8 weights with an FP8 KV cache, alternating
#   fp8throughput  Llama-3.1-8B, 400 requests of 1,000 in / 1,000 out at once, bf16 against FP8 weights and KV cache
#   fp8profile  the Llama-3.1-8B FP8 workload step by step, with torch.profiler windows (benchmarks/gpu_step_profile.py)
#   fp8kv       the standard workload with a bf16 against an FP8 KV cache, alternating, two rounds
#   speculation  Qwen3-0.6B batch 1 (4 x 512 tokens) and the standard workload, without speculation against ngram,
#               alternating
#   routers     the standard workload with a bf16 KV cache through one router, with an FP8 KV cache through one and
#               through two, alternating, the load from two client processes
#   moe         the fused MoE kernels' GPU tests, the layer against its torch reference by token count in bf16, FP8
#               and 4 bits (benchmarks/fused_moe.py), then Qwen3-30B-A3B batch 1 in FP8, 4 bits (GPTQ) and bf16 and the
#               standard workload beside Qwen3-0.6B's
#   w4a16       the 4-bit decode kernel against the copy at Llama-3.1-8B's projections (benchmarks/w4a16_decode.py), then
#               Llama-3.1-8B batch 1 in 4 bits (GPTQ) beside its floor (benchmarks/decode_floor.py), and the 400 x 1,000 /
#               1,000 workload in 4 bits, bf16 and FP8
#   window      Mistral-7B-v0.1's KV blocks in use over 8 prompts of 32k tokens, with its sliding window and without;
#               the attention kernels of sliding and global layers in decode steps of Gemma-3-4B and gpt-oss-20b
#               (benchmarks/sliding_window.py)
# Needs Sluice installed: `pip install -e .`, or on a machine without grpcio-tools the wheel that
# `pip wheel --no-deps --no-build-isolation -w .whl .` builds here. PYTHONSAFEPATH keeps the checkout's folders
# (router/, kernels/) off sys.path, where they would shadow the installed packages.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
DUMMY=(--load-format dummy --dtype bfloat16 --device cuda)
FP8="--quantization fp8 --kv-cache-dtype fp8"
serve_8b() {  # name, requests per second, number of requests, then `sluice serve` flags
  python3 -m sluice.cli --log-level WARNING serve --model Llama-3.1-8B "${DUMMY[@]}" --port 50051 "${@:4}" \
    > "$OUT/$1.log" 2>&1 &
  local server=$!
  timeout 300 bash -c 'until grep -q "is serving" "$0"; do sleep 2; done' "$OUT/$1.log"
  timeout 120 python3 -m sluice.cli bench serve --address 127.0.0.1:50051 --rate $2 --num-requests $3 \
    --input-len 1024 1024 --output-len 256 256 --vocab-size 128256 --out "$OUT/$1.json" 2>/dev/null | tail -12
  kill $server; wait $server
}
bench() { timeout ${BENCH_TIMEOUT:-200} python3 -m sluice.cli --log-level WARNING bench "$@" 2> >(grep -v Warning | tail -20 >&2) | tail -3; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
for stage in ${STAGES:-agreement worker profile throughput latency serve sampling kernels}; do
  echo "== $stage $(date +%T)"
  case $stage in
    agreement) timeout 300 python3 benchmarks/gpu_agreement.py "$OUT/agreement.json" 2>&1 | grep -v Warning | tail -12 ;;
    worker)
      timeout 200 python3 benchmarks/gpu_worker_check.py "$OUT/worker.json" 2>&1 | grep -v Warning | tail -45
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/worker/test_decode_graphs.py 2>&1 | tail -3 ;;
    profile) timeout 200 python3 benchmarks/gpu_step_profile.py "$OUT/profile.json" 2>&1 | grep -v Warning | head -40 ;;
    throughput)
      for mode in --in-process ""; do
        bench throughput --model Qwen3-0.6B "${DUMMY[@]}" $mode --out "$OUT/throughput${mode:+_inproc}.json"
      done ;;
    latency)
      for model in Qwen3-0.6B Llama-3.1-8B; do
        for mode in --in-process ""; do
          bench latency --model $model "${DUMMY[@]}" $mode --out "$OUT/latency_$model${mode:+_inproc}.json"
        done
      done ;;
    serve) serve_8b serve 8 200 ;;
    serve16)
      for flags in "" "$FP8"; do
        echo "-- ${flags:-bf16}"
        serve_8b "serve16_${flags//[ .-]/}" 16 300 --max-num-batched-tokens 512 $flags
      done ;;
    linear)
      timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_linear.py 2>&1 | tail -3
      timeout 400 python3 benchmarks/kernel_linear.py "$OUT/linear.json" ${LINEAR_ARGS:-} 2>&1 | grep -v Warning ;;
    fp8linear)
      timeout 300 python3 benchmarks/kernel_linear.py "$OUT/linear_fp8.json" --fp8 --models Llama-3.1-8B 2>&1 \
        | grep -v Warning ;;
    fp8rows) timeout 300 python3 benchmarks/scaled_mm_rows.py "$OUT/scaled_mm_rows.json" 2>&1 | grep -v Warning ;;
    fp8kernels) timeout 200 python3 -P benchmarks/fp8_kernels.py 2>&1 | grep -v Warning | tee "$OUT/fp8_kernels.md" ;;
    fp8latency)
      for flags in "" "$FP8" "" "$FP8"; do
        echo "-- latency ${flags:-bf16}"
        bench latency --model Llama-3.1-8B "${DUMMY[@]}" $flags --out "$OUT/latency_8b_${flags//[ .-]/}.json"
      done ;;
    fp8throughput)
      for flags in "" "$FP8"; do
        echo "-- 400 x 1,000 in / 1,000 out ${flags:-bf16}"
        BENCH_TIMEOUT=300 bench throughput --model Llama-3.1-8B "${DUMMY[@]}" $flags --num-requests 400 --input-len 1000 1000 \
          --output-len 1000 1000 --max-num-seqs 512 --out "$OUT/throughput_8b_${flags//[ .-]/}.json"
      done ;;
    w4a16)
      timeout 300 python3 benchmarks/w4a16_decode.py "$OUT/w4a16_decode.json" --sweep 2>&1 | grep -v -i warn | tail -12
      timeout 120 python3 benchmarks/decode_floor.py "$OUT/floor_8b_gptq.json" --quantization gptq 2>&1 | tail -1
      bench latency --model Llama-3.1-8B "${DUMMY[@]}" --quantization gptq --in-process \
        --out "$OUT/latency_8b_gptq_inproc.json"
      for flags in "--quantization gptq" "" "$FP8"; do
        echo "-- 400 x 1,000 in / 1,000 out ${flags:-bf16}"
        BENCH_TIMEOUT=300 bench throughput --model Llama-3.1-8B "${DUMMY[@]}" $flags --num-requests 400 \
          --input-len 1000 1000 --output-len 1000 1000 --max-num-seqs 512 --out "$OUT/throughput_8b_${flags//[ .-]/}.json"
      done ;;
    fp8profile)
      timeout 400 python3 benchmarks/gpu_step_profile.py "$OUT/profile_8b_fp8.json" --model Llama-3.1-8B $FP8 \
        --num-requests 400 --input-len 1000 1000 --output-len 1000 1000 --max-num-seqs 512 2>&1 | grep -v Warning | head -60 ;;
    fp8kv)
      for round in 1 2; do
        for flags in "" "--kv-cache-dtype fp8"; do
          echo "-- standard workload ${flags:-bf16 KV cache}, round $round"
          bench throughput --model Qwen3-0.6B "${DUMMY[@]}" $flags \
            --out "$OUT/throughput_kv${flags//[ .-]/}_$round.json"
        done
      done ;;
    speculation)
      for round in 1 2; do
        for flags in "" "--speculative-method ngram"; do
          echo "-- batch 1 ${flags:-without speculation}, round $round"
          bench latency --model Qwen3-0.6B "${DUMMY[@]}" $flags --num-requests 4 --output-len 512 512 \
            --out "$OUT/latency_spec${flags//[ .-]/}_$round.json"
        done
      done
      for flags in "" "--speculative-method ngram"; do
        echo "-- standard workload ${flags:-without speculation}"
        bench throughput --model Qwen3-0.6B "${DUMMY[@]}" $flags --out "$OUT/throughput_spec${flags//[ .-]/}.json"
      done ;;
    routers)
      for round in 1 2; do
        for setup in "auto 1" "fp8 1" "fp8 2"; do
          read -r kv routers <<< "$setup"
          echo "-- $kv KV cache, $routers router process(es), round $round"
          bench throughput --model Qwen3-0.6B "${DUMMY[@]}" --kv-cache-dtype $kv --router-processes $routers \
            --client-processes 2 --out "$OUT/throughput_kv${kv}_routers${routers}_$round.json"
        done
      done ;;
    sampling)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_seeded_uniform.py \
        tests/kernels/test_candidate_draw.py tests/worker/test_sampler.py tests/worker/test_sampling_search.py \
        tests/worker/test_speculative_sampling.py 2>&1 | tail -5 | tee "$OUT/sampling_tests.txt"
      timeout 200 python3 benchmarks/sampling.py --device cuda --batch 256 --vocab 151936 2>&1 | grep "per step"
      for flags in "" "--temperature 0.8 --top-p 0.95 --top-k 50" "--temperature 0.8 --top-p 0.95" \
          "--temperature 0.7 --repetition-penalty 1.1 --frequency-penalty 0.2 --logprobs 5"; do
        echo "-- ${flags:-greedy}"
        bench throughput --model Qwen3-0.6B "${DUMMY[@]}" $flags --out "$OUT/throughput_${flags//[ .-]/}.json"
      done ;;
    moe)
      timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fused_moe.py 2>&1 | tail -3
      timeout 300 python3 benchmarks/fused_moe.py "$OUT/fused_moe.json" 2>&1 | grep -v Warning | tail -30
      for scales in rows blocks; do
        timeout 200 python3 benchmarks/fused_moe.py "$OUT/fused_moe_fp8_$scales.json" --fp8 $scales 2>&1 \
          | grep -v Warning | tail -14
      done
      timeout 200 python3 benchmarks/fused_moe.py "$OUT/fused_moe_w4a16.json" --w4a16 2>&1 | grep -v Warning | tail -14
      for method in fp8 gptq; do
        bench latency --model Qwen3-30B-A3B "${DUMMY[@]}" --quantization $method --in-process \
          --out "$OUT/latency_Qwen3-30B-A3B_${method}_inproc.json"
      done
      for model in Qwen3-30B-A3B Qwen3-0.6B; do
        bench latency --model $model "${DUMMY[@]}" --in-process --out "$OUT/latency_${model}_inproc.json"
        BENCH_TIMEOUT=400 bench throughput --model $model "${DUMMY[@]}" --out "$OUT/throughput_$model.json"
      done ;;
    window)
      timeout 420 python3 benchmarks/sliding_window.py "$OUT/sliding_window.json" 2>&1 \
        | grep -v -e Warning -e STAGE: -e USDT: | tail -30 ;;
    vl)
      for images in 1 0; do
        bench throughput --model Qwen2.5-VL-7B "${DUMMY[@]}" --num-requests 256 --input-len 100 100 \
          --output-len 128 128 --images-per-request $images --image-size 448 448 --out "$OUT/vl_images$images.json"
      done ;;
    warmup)
      timeout 400 python3 -m pytest -q -p no:cacheprovider tests/worker/test_sampler_warm_up.py 2>&1 | tail -3 \
        | tee "$OUT/warm_up_tests.txt"
      timeout 900 python3 benchmarks/first_request.py --model Qwen3-0.6B "${DUMMY[@]}" 2>&1 \
        | grep -v -e Warning -e INFO | tail -14 | tee "$OUT/first_request.txt" ;;
    kernels)
      timeout 400 python3 -m pytest -q -x -p no:cacheprovider tests/kernels 2>&1 | tail -5 | tee "$OUT/kernel_tests.txt"
      timeout 120 python3 benchmarks/kernel_timings.py "$OUT/kernels.json" 2>&1 | tail -40 ;;
  esac
done
