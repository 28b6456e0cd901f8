#!/usr/bin/env bash
# One call on the GPU machine (the `device` tool): set up, then run the named stages.
#   bash scripts/gpu_session.sh tests decode prefill     # cuda tests + attention benchmarks
#   bash scripts/gpu_session.sh bundled                  # `flashtune run` on the bundled dataset
#   bash scripts/gpu_session.sh sampling dropin e2e      # issue 16, 14 and 19 measurements
#   bash scripts/gpu_session.sh decode-variants dropin-full   # issue 14 and 18
#   bash scripts/gpu_session.sh gluon-tests mla-prefill       # the sm_90 Gluon kernels: tests, MLA bench
#   bash scripts/gpu_session.sh ncu-gluon                     # Nsight Compute on them and their peers
# Stages read optional settings from the environment: SAMPLING_ARGS (bench_sampling.py), DROPIN_ARGS
# DROPIN_DEADLINE (seconds for the whole drop-in run, below the call's limit) and DROPIN_WORKERS
# (test processes a file, 4), DROPIN_K (a pytest -k expression for dropin-full), E2E_ARGS,
# MLA_ARGS (bench_mla.py), GDN_ARGS (bench_gdn.py), MAMBA_ARGS (bench_mamba.py), FI072_BENCH_ARGS and FI072_BENCH_TIMEOUT
# (stage fi072-bench: bench_fi072.py's arguments, and its seconds).
# Needs the ignored folder .peer/ (made by scripts/fetch_gpu_deps.sh) carried along: FlashInfer's source archive (the peer) and
# wheels of what the GPU image lacks (pydantic). Logs and result rows go to $OUT (at most 8
# files come back from it: benchmarks write their rows there through RowWriter). The copy's
# .git may be stale: name the commit being measured, FLASHTUNE_BENCH_COMMIT=$(git rev-parse
# --short HEAD), in the command, so the result rows carry it.
set -uo pipefail
OUT=${OUT:-/tmp/flashtune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .peer/wheels pydantic filelock safetensors >"$OUT/setup.log" 2>&1
# einops: FlashInfer's fp8 GEMM test imports it (drop-in run); absent from an older .peer/wheels
python3 -m pip install -q --no-index --find-links .peer/wheels einops >>"$OUT/setup.log" 2>&1 || true
if [ -d .peer/ray ]; then  # RAY=1 scripts/fetch_gpu_deps.sh: the slim Ray wheel and its dependencies
  python3 -m pip install -q --no-index --find-links .peer/ray ray >>"$OUT/setup.log" 2>&1
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
# shellcheck disable=SC1091
source .peer/flashinfer-from-sdist.sh .peer/flashinfer_python-0.2.14.post1.tar.gz >>"$OUT/setup.log" 2>&1
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws TRITON_CACHE_DIR=/tmp/ft-triton
# Compiled kernels of an earlier call (stage save-jit below; copy its files into .peer/) skip FlashInfer's JIT (~15 s a kernel)
# and Triton's compiles: ninja and Triton both see their outputs up to date.
if compgen -G ".peer/jit-fi.tgz.*" >/dev/null; then
  cat .peer/jit-fi.tgz.* | tar xzf - -C /tmp && echo "restored FlashInfer's JIT builds" | tee -a "$OUT/setup.log"
fi
if [ -f .peer/jit-triton.tgz ]; then
  tar xzf .peer/jit-triton.tgz -C /tmp && echo "restored Triton's cache" | tee -a "$OUT/setup.log"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/setup.log"
python3 -c "import torch, triton, pydantic, flashtune; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/setup.log"

for stage in "$@"; do
  start=$(date +%s)
  case "$stage" in
    tests)  # the Gluon kernels' tests apart (stage gluon-tests): cold, they take ~270 s alone
      timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 120 tests/ops tests/test_timing.py \
        tests/bench tests/capture tests/tune --ignore=tests/ops/attention/test_prefill_hopper.py \
        --ignore=tests/ops/test_mla_hopper.py >"$OUT/cuda_tests.log" 2>&1
      tail -n 25 "$OUT/cuda_tests.log" ;;
    bench-tests)
      timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 200 tests/bench tests/test_timing.py \
        >"$OUT/bench_tests.log" 2>&1
      tail -n 40 "$OUT/bench_tests.log" ;;
    gluon-tests)  # the Gluon sm_90 kernels' cuda tests (GQA prefill, MLA prefill), split over
      # GLUON_WORKERS (4) pytest processes on the one GPU: each test compiles its own variant, so
      # one process takes ~270 s cold where four take ~100 s.
      gdir=$(mktemp -d)
      python3 -m pytest -q -m cuda --co -p no:cacheprovider tests/ops/attention/test_prefill_hopper.py \
        tests/ops/test_mla_hopper.py 2>/dev/null | grep "::" >"$gdir/ids"
      split -n "r/${GLUON_WORKERS:-4}" "$gdir/ids" "$gdir/part_"
      for part in "$gdir"/part_*; do
        (tr '\n' '\0' <"$part" | xargs -0 timeout 280 python3 -m pytest -q -m cuda -p no:cacheprovider \
          --timeout 250 -rf >"$part.log" 2>&1; echo "exit $?" >>"$part.log") &
      done
      wait
      cat "$gdir"/part_*.log >"$OUT/gluon_tests.log"
      grep -E "passed|failed|error|^exit|^FAILED" "$OUT/gluon_tests.log" | tail -n 20 ;;
    script)  # a one-off experiment in this environment: SCRIPT names a bash file (e.g. under the ignored .gpujobs/)
      timeout "${SCRIPT_TIMEOUT:-500}" bash "${SCRIPT:?set SCRIPT}" 2>&1 | tee "$OUT/script.log" | tail -n 60 ;;
    mla-prefill)  # issue 34: MLA prefill and MTP (Triton, the Gluon runner's tactics) vs FlashInfer 0.2.14
      timeout 400 python3 benchmarks/bench_mla.py ${MLA_ARGS:---only prefill mtp} 2>&1 | tee "$OUT/mla.log" | tail -n 30 ;;
    ncu-gluon)  # issue 34/37: Nsight Compute on one call of each Gluon kernel and its peer
      # (benchmarks/profile_gluon.py; ncu reads the counters on Firecracker machines, KINDS.md)
      timeout 420 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats python3 benchmarks/profile_gluon.py ${NCU_ARGS:-} >"$OUT/ncu_gluon.txt" 2>&1
      grep -E "^  [a-zA-Z_].*\(|Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|us \(warm" "$OUT/ncu_gluon.txt" | head -n 80 ;;
    attn-tests)
      timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 120 tests/ops/attention \
        >"$OUT/cuda_tests.log" 2>&1
      tail -n 25 "$OUT/cuda_tests.log" ;;
    decode) timeout 120 python3 benchmarks/bench_decode.py --quick --only grid 2>&1 | tee "$OUT/decode.log" | tail -n 30 ;;
    decode-full) timeout 300 python3 benchmarks/bench_decode.py --only grid 2>&1 | tee -a "$OUT/decode.log" | tail -n 60 ;;
    decode-sweep) timeout 240 python3 benchmarks/bench_decode.py --only sweep 2>&1 | tee -a "$OUT/decode.log" | tail -n 12 ;;
    capture) timeout 90 python3 benchmarks/bench_capture.py 2>&1 | tee "$OUT/capture.log" | tail -n 12 ;;
    prefill) timeout 110 python3 benchmarks/bench_prefill.py 2>&1 | tee "$OUT/prefill.log" | tail -n 25 ;;
    prefill-grid) timeout 240 python3 benchmarks/bench_prefill.py --no-tune 2>&1 | tee "$OUT/prefill.log" | tail -n 40 ;;
    decode-variants)  # issue 14: fused RoPE overhead, fp8-KV decode vs FlashInfer (default and tuned)
      timeout 500 python3 benchmarks/bench_decode.py --only variants 2>&1 | tee "$OUT/variants.log" | tail -n 45 ;;
    variant-sweep)  # every decode tactic for plain, RoPE and fp8 decode: what the defaults should be
      timeout 330 python3 benchmarks/bench_decode.py --only variant-sweep 2>&1 | tee "$OUT/variant_sweep.log" | tail -n 30 ;;
    decode-extra) timeout 120 python3 benchmarks/bench_decode.py --only skewed 2>&1 | tee -a "$OUT/decode.log" | tail -n 3
      timeout 120 python3 benchmarks/bench_decode.py --only cascade 2>&1 | tee -a "$OUT/decode.log" | tail -n 3 ;;
    bundled)
      timeout 500 python3 benchmarks/bench_bundled.py run /tmp/bundled 2>&1 | tee "$OUT/bundled.log" | tail -n 60
      python3 benchmarks/bench_bundled.py rows /tmp/bundled 2>&1 | tail -n 5
      # The traces come back too: `bench_bundled.py repeat A B` compares two runs locally.
      tar czf "$OUT/bundled_traces.tgz" -C /tmp/bundled traces ;;
    gemm-tests)
      timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 120 tests/ops/test_gemm.py tests/tune \
        >"$OUT/gemm_tests.log" 2>&1
      tail -n 15 "$OUT/gemm_tests.log" ;;
    bundled-gemm)
      timeout 200 python3 benchmarks/bench_bundled.py run /tmp/bundled-gemm --definitions 'gemm*' \
        2>&1 | tee "$OUT/bundled_gemm.log" | tail -n 60 ;;
    bundled-decode)
      timeout 200 python3 benchmarks/bench_bundled.py run /tmp/bundled-decode --definitions 'gqa_paged_decode*' \
        2>&1 | tee "$OUT/bundled_decode.log" | tail -n 40 ;;
    sampling)
      # A full grid compiles ~25 s per (op, vocab): one vocabulary group per call.
      timeout 500 python3 benchmarks/bench_sampling.py ${SAMPLING_ARGS:---vocab 128256 --scales 8} \
        2>&1 | tee "$OUT/sampling.log" | tail -n 30 ;;
    block-sparse)
      timeout 500 python3 benchmarks/bench_block_sparse.py 2>&1 | tee "$OUT/block_sparse.log" | tail -n 25 ;;
    dropin)
      # --deadline ends the run with its summary (partial files included) before the call does.
      python3 scripts/flashinfer_dropin/run.py --deadline "${DROPIN_DEADLINE:-450}" \
        --per-test-timeout 120 --triton-cache /tmp/ft-triton --workers "${DROPIN_WORKERS:-4}" \
        ${DROPIN_ARGS:-} \
        2>&1 | tee "$OUT/dropin.log" | tail -n 40 ;;
    dropin-full)  # whole test files (DROPIN_FILES), the sample split over DROPIN_WORKERS processes
      python3 scripts/flashinfer_dropin/run.py --full --files "${DROPIN_FILES:-test_block_sparse}" \
        ${DROPIN_K:+-k "$DROPIN_K"} --deadline "${DROPIN_DEADLINE:-450}" --per-test-timeout 120 --triton-cache /tmp/ft-triton \
        --workers "${DROPIN_WORKERS:-6}" 2>&1 | tee "$OUT/dropin_full.log" | tail -n 20 ;;
    gdn-tests)  # issue 39: Gated Delta Net's cuda tests (bf16, Qwen3-Next's shapes)
      timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 300 tests/ops/test_gdn.py \
        tests/ops/test_gdn_schema.py >"$OUT/gdn_tests.log" 2>&1
      tail -n 25 "$OUT/gdn_tests.log" ;;
    gdn)  # issue 39: bench_gdn.py against fla-core's Triton kernels (its wheel from .peer/wheels)
      python3 -m pip install -q --no-deps --no-index .peer/wheels/fla_core-*.whl >>"$OUT/setup.log" 2>&1 || true
      timeout 500 python3 benchmarks/bench_gdn.py ${GDN_ARGS:---quick} 2>&1 | tee "$OUT/gdn.log" | tail -n 40 ;;
    mamba-tests)  # issue 39: Mamba-2 selective state update's cuda tests (bf16, NemotronH's shapes)
      timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider --timeout 300 tests/ops/test_mamba.py \
        tests/ops/test_mamba_schema.py >"$OUT/mamba_tests.log" 2>&1
      tail -n 25 "$OUT/mamba_tests.log" ;;
    mamba)  # issue 39: bench_mamba.py against mamba-ssm's Triton kernel (its source from .peer/wheels)
      timeout 500 python3 benchmarks/bench_mamba.py ${MAMBA_ARGS:---quick} 2>&1 | tee "$OUT/mamba.log" | tail -n 40 ;;
    e2e-profile)  # per-kernel time of one decode step per backend (PROFILE_ARGS)
      timeout 400 python3 benchmarks/profile_e2e.py ${PROFILE_ARGS:---batch 1 --kv-len 1024} \
        2>&1 | grep -v "^$" | tee "$OUT/profile_e2e.log" | tail -n 40 ;;
    e2e)
      timeout 500 python3 -m flashtune.cli e2e ${E2E_ARGS:---layers 4 --quick} \
        2>&1 | tee "$OUT/e2e.log" | tail -n 40 ;;
    save-jit)  # compiled FlashInfer and Triton kernels back to $OUT, for .peer/jit-cache.tgz next time
      # Two archives: one file may bring back at most 16 MiB.
      # FlashInfer's builds pass 16 MiB: split in parts (jit-fi.tgz.aa, .ab, ...).
      tar czf - -C /tmp fi-ws 2>/dev/null | split -b 15m - "$OUT/jit-fi.tgz."
      tar czf "$OUT/jit-triton.tgz" -C /tmp ft-triton
      ls -la "$OUT"/jit-* ;;
    fi072)  # FlashInfer 0.7.2.post1 (issue 37) in a subshell of its own: the slim wheel's check,
      # a JIT build of the modules FI072_BUILD matches (a regex; check_flashinfer_slim.py --list)
      ( source scripts/flashinfer072.sh .peer/fi072 && timeout 500 python3 scripts/check_flashinfer_slim.py --smoke --deadline 420 \
          --build "${FI072_BUILD:-^(norm|silu_and_mul|rope|sampling|decode_bf16_kv_bf16_h128_pe0|prefill_fa2_primary_bf16_kv_bf16_h128_pe0|prefill_fa3_bf16_o_bf16_h128x128|mla_fa2_bf16|mla_fa3_bf16|xqa_bf16_kv_bf16_p16_h128_g8)\$}" ) \
        >"$OUT/fi072.log" 2>&1
      tail -n 30 "$OUT/fi072.log" ;;
    fi072-bench)  # issue 37: benchmarks/bench_fi072.py, flashtune vs FlashInfer 0.7.2.post1, in a
      # subshell of its own like fi072; FI072_BENCH_ARGS (--only FAMILY.. --quick --budget-s S)
      ( source scripts/flashinfer072.sh .peer/fi072 && timeout -k 5 "${FI072_BENCH_TIMEOUT:-500}" \
          python3 benchmarks/bench_fi072.py ${FI072_BENCH_ARGS:---quick --budget-s 420} ) \
        >"$OUT/fi072_bench.log" 2>&1
      tail -n 60 "$OUT/fi072_bench.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - start )) s"
done
