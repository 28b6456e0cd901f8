#!/usr/bin/env bash
# Fill the ignored folder .peer/ with what a GPU machine of the `device` tool lacks (it has no
# network): FlashInfer 0.2.14.post1's source archive (the peer in every benchmark) with its
# loader script, Python 3.12 wheels of pydantic (flashtune's data model) and friends, fla-core
# (flash-linear-attention's kernels, the GDN benchmark's peer), and with
# RAY=1 a slim Ray wheel and its dependencies in .peer/ray/ (for `flashtune run --ray local`),
# and FlashInfer 0.7.2.post1 for sm90 in .peer/fi072/ (where it fits; FI072=0: not).
# Run it once here, then pass carry=[".peer"] to each run (scripts/gpu_session.sh uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh clone may lack .git/info/ (git does not create it): make it before writing there.
mkdir -p .git/info
grep -qx '/.peer/' .git/info/exclude 2>/dev/null || echo '/.peer/' >> .git/info/exclude
mkdir -p .peer/wheels
sdist=flashinfer_python-0.2.14.post1.tar.gz
if [ ! -f ".peer/$sdist" ]; then
  # By name, through pip's own configuration: no registry address in this repository.
  # --no-build-isolation: pip prepares an sdist's metadata even for a download, and in an
  # isolated build environment the sdist's build requirements (torch) cannot be resolved.
  python3 -m pip download -q --no-deps --no-build-isolation --no-binary :all: \
    flashinfer-python==0.2.14.post1 -d .peer
fi
[ -f .peer/flashinfer-from-sdist.sh ] || cp ../shared/gpu/flashinfer-from-sdist.sh .peer/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .peer/wheels pydantic pydantic-core annotated-types typing-inspection typing-extensions filelock safetensors \
  einops  # einops: imported by FlashInfer's test_groupwise_scaled_gemm_fp8.py (the drop-in run)
# flash-linear-attention 0.6.0 (the GDN benchmark's peer, benchmarks/bench_gdn.py): the package
# is split, its kernels (fla.ops, pure Python + Triton, needing einops) in fla-core; the GPU
# machine installs fla-core only (pip install --no-deps .peer/wheels/fla_core-*.whl): the
# flash-linear-attention wheel adds the model layers and needs transformers.
python3 -m pip download -q --no-deps -d .peer/wheels flash-linear-attention==0.6.0 fla-core==0.6.0
# mamba-ssm's source archive (the Mamba benchmark's peer, benchmarks/bench_mamba.py imports
# its pure-Triton mamba_ssm/ops/triton/selective_state_update.py by file path: its CUDA
# extension is not built). MAMBA_SKIP_CUDA_BUILD: pip prepares the sdist's metadata, which
# otherwise looks for nvcc.
[ -f .peer/wheels/mamba_ssm-2.3.2.post1.tar.gz ] || MAMBA_SKIP_CUDA_BUILD=TRUE \
  python3 -m pip download -q --no-deps --no-build-isolation --no-binary :all: \
  mamba-ssm==2.3.2.post1 -d .peer/wheels
if [ "${RAY:-0}" = 1 ]; then
  # Ray's wheel is ~80 MB and the carry limit 64 MiB: keep its core (scripts/slim_ray_wheel.py).
  mkdir -p .peer/ray .peer/ray-full
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .peer/ray-full "ray==$(sed -n 's/^ray==//p' constraints.txt)"
  for wheel in .peer/ray-full/*.whl; do
    case "$(basename "$wheel")" in
      ray-*) python3 scripts/slim_ray_wheel.py "$wheel" .peer/ray ;;
      *) cp "$wheel" .peer/ray/ ;;
    esac
  done
  rm -rf .peer/ray-full
fi
# FlashInfer 0.7.2.post1 beside 0.2.14 (issue 37): a slim wheel, apache-tvm-ffi and the cuRAND /
# cuBLAS headers in .peer/fi072/ (~16 MiB; scripts/fetch_flashinfer072.sh), loaded on the GPU
# machine by `source scripts/flashinfer072.sh`. By default only if a run's carry stays under
# 64 MiB (with RAY=1 it does not); FI072=1 forces it, FI072=0 skips it. It prints the carry.
case "${FI072:-auto}" in
  0) ;;
  1) bash scripts/fetch_flashinfer072.sh ;;
  *) bash scripts/fetch_flashinfer072.sh auto ;;
esac
ls -la .peer .peer/wheels
