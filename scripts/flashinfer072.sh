#!/bin/bash
# Source on the GPU machine (no network) to make FlashInfer 0.7.2.post1 the `flashinfer` of this
# shell, beside 0.2.14 (.peer/flashinfer-from-sdist.sh, sourced in another shell or process):
#   source scripts/flashinfer072.sh [DIR]     # DIR: what scripts/fetch_flashinfer072.sh made,
#                                             # .peer/fi072 by default (carry .peer)
#   python3 -c "import flashinfer; print(flashinfer.__version__)"     # 0.7.2.post1
# It installs the slim wheel, apache-tvm-ffi and (only where the image lacks them) the fallback
# wheels with --no-deps into a private folder, FI072_PREFIX (/tmp/fi072), unpacks the cuRAND /
# cuBLAS / NVTX headers there, and exports:
#   PYTHONPATH                 that folder first: 0.7.2 wins over a 0.2.14 put there earlier
#   CPATH                      the headers (gcc and nvcc's host passes look there, after -I)
#   FLASHINFER_EXTRA_CUDAFLAGS / _CFLAGS  the same folder as -isystem, for FlashInfer's JIT
#   FLASHINFER_NO_DOWNLOAD=1   never the network (no cubins: the sm90 paths build from source)
#   FLASHINFER_WORKSPACE_BASE  its JIT builds apart from 0.2.14's (FI072_WORKSPACE_BASE,
#                              /tmp/fi072-ws; builds land in .cache/flashinfer/0.7.2.post1/90a/)
#   FLASHINFER_CUDA_ARCH_LIST  9.0 (sm_90a) unless set; CUDA_HOME from nvcc's real path unless
#                              set (FlashInfer takes `which nvcc`/../.. without resolving links,
#                              and links against $CUDA_HOME/lib64); MAX_JOBS 16 unless set.
# Idempotent: a second source (same DIR contents) only exports, in well under a second.
fi072_src=${1:-.peer/fi072}
fi072_dest=${FI072_PREFIX:-${TMPDIR:-/tmp}/fi072}
fi072_wheel=$( (ls "$fi072_src"/flashinfer_python-0.7.2*.whl 2>/dev/null || true) | head -1)
if [ -z "$fi072_wheel" ]; then
  echo "flashinfer072.sh: no flashinfer_python-0.7.2*.whl in $fi072_src (run scripts/fetch_flashinfer072.sh)" >&2
  return 1 2>/dev/null || exit 1
fi
# What was installed from: names, sizes and times of the inputs.
fi072_key=$( (cd "$fi072_src" && ls -l --time-style=+%s -- *.whl *.tar.gz fallback/*.whl 2>/dev/null || true) | awk '{print $5, $6, $7}' | cksum)
if [ "$(cat "$fi072_dest/.installed" 2>/dev/null)" != "$fi072_key" ]; then
  rm -rf "$fi072_dest" && mkdir -p "$fi072_dest/cuda"
  # nvidia-ml-py, tqdm, tabulate: on the image; their wheels go in only where an import fails
  fi072_extra=()
  for fi072_pair in pynvml:nvidia_ml_py tqdm:tqdm tabulate:tabulate; do
    python3 -c "import ${fi072_pair%%:*}" 2>/dev/null \
      || fi072_extra+=("$fi072_src"/fallback/"${fi072_pair#*:}"-*.whl)
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$fi072_dest/site" "$fi072_wheel" "$fi072_src"/apache_tvm_ffi-*.whl "${fi072_extra[@]}" >&2 \
    || return 1 2>/dev/null || exit 1
  if [ -f "$fi072_src/cuda-headers.tar.gz" ]; then
    tar xzf "$fi072_src/cuda-headers.tar.gz" -C "$fi072_dest/cuda" || return 1 2>/dev/null || exit 1
  fi
  echo "$fi072_key" > "$fi072_dest/.installed"
fi
case ":${PYTHONPATH:-}:" in
  *":$fi072_dest/site:"*) ;;
  *) export PYTHONPATH="$fi072_dest/site${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
case ":${CPATH:-}:" in
  *":$fi072_dest/cuda/include:"*) ;;
  *) export CPATH="${CPATH:+$CPATH:}$fi072_dest/cuda/include" ;;
esac
case " ${FLASHINFER_EXTRA_CUDAFLAGS:-} " in
  *" $fi072_dest/cuda/include "*) ;;
  *) export FLASHINFER_EXTRA_CUDAFLAGS="${FLASHINFER_EXTRA_CUDAFLAGS:+$FLASHINFER_EXTRA_CUDAFLAGS }-isystem $fi072_dest/cuda/include" ;;
esac
case " ${FLASHINFER_EXTRA_CFLAGS:-} " in
  *" $fi072_dest/cuda/include "*) ;;
  *) export FLASHINFER_EXTRA_CFLAGS="${FLASHINFER_EXTRA_CFLAGS:+$FLASHINFER_EXTRA_CFLAGS }-isystem $fi072_dest/cuda/include" ;;
esac
export FLASHINFER_NO_DOWNLOAD=1
export FLASHINFER_WORKSPACE_BASE=${FI072_WORKSPACE_BASE:-/tmp/fi072-ws}
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null 2>&1; then
  # nvcc says where its toolkit is (TOP), also when the nvcc on PATH is a wrapper script
  fi072_top=$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  if [ -n "$fi072_top" ] && [ -d "$fi072_top" ]; then
    CUDA_HOME=$(cd "$fi072_top" && pwd -P)
  else
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
  export CUDA_HOME
fi
unset fi072_src fi072_dest fi072_wheel fi072_key fi072_pair fi072_extra fi072_top
