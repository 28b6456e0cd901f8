#!/usr/bin/env bash
# FlashInfer 0.7.2.post1 for the GPU machine (issue 37), beside 0.2.14, into .peer/fi072/:
#   flashinfer_python-0.7.2.post1-py3-none-any.whl  slimmed to its Hopper JIT paths (~12 MiB of
#                                  ~59; scripts/slim_flashinfer_wheel.py says what it keeps)
#   hopper-manifest.json           what the slimming kept, for scripts/check_flashinfer_slim.py
#   apache_tvm_ffi-*-cp312-*.whl   0.7.2's FFI runtime, which the GPU image lacks
#   fallback/*.whl                 small pure-Python packages 0.7.2 imports that the image has
#                                  (nvidia-ml-py, tqdm, tabulate): installed there only if absent
#   cuda-headers.tar.gz            include/ of cuRAND, cuBLAS and NVTX from NVIDIA's CUDA 13
#                                  wheels, headers only: sampling, XQA and CCCL include them
# scripts/flashinfer072.sh, sourced on the GPU machine, installs them. Called by
# scripts/fetch_gpu_deps.sh (FI072=0 there skips it, FI072=1 forces it, by default only if the
# carry stays under 64 MiB); idempotent: what exists is kept.
# Downloads needed only here (the full wheel, NVIDIA's ~480 MB of library wheels, packages for
# this machine's Python to run the slimming) go to .peer-build/ (ignored, never carried).
#   bash scripts/fetch_flashinfer072.sh [auto]   # auto: only if a run's carry stays under 64 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
# What a `run` carries: the working tree (tracked and untracked files that git does not
# ignore) and the carried .peer/, 64 MiB in all.
carried() {
  local tree peer
  tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  peer=$(du -sb --exclude=.peer/fi072 .peer 2>/dev/null | cut -f1)
  echo "$tree ${peer:-0}"
}
if [ "${1:-}" = auto ] && [ ! -f .peer/fi072/hopper-manifest.json ]; then
  read -r tree peer < <(carried)
  # ~17 MiB for .peer/fi072 (measured 16.3 MiB)
  if [ $(( (tree + peer) / 1048576 + 17 )) -gt 64 ]; then
    echo "FlashInfer 0.7.2 not fetched: the tree ($(( tree / 1048576 )) MiB) and .peer ($(( peer / 1048576 )) MiB) leave no 17 MiB under 64 MiB (FI072=1 forces it)"
    exit 0
  fi
fi
mkdir -p .git/info
grep -qx '/.peer-build/' .git/info/exclude 2>/dev/null || echo '/.peer-build/' >> .git/info/exclude
dest=.peer/fi072
build=.peer-build/fi072
mkdir -p "$dest" "$build"
version=0.7.2.post1
tvm_ffi=0.1.15.post2  # flashinfer-python 0.7.2.post1 requires apache-tvm-ffi>=0.1.11,<0.2
wheel=flashinfer_python-$version-py3-none-any.whl
py312=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

if [ ! -f "$dest/$wheel" ] || [ ! -f "$dest/hopper-manifest.json" ]; then
  # By name, through pip's own configuration: no registry address in this repository.
  [ -f "$build/$wheel" ] || python3 -m pip download -q --no-deps "flashinfer-python==$version" -d "$build"
  # The slimming imports flashinfer here (its JIT generators, nothing compiled): whatever of
  # its import-time needs this Python lacks goes to a private directory.
  host_site=$PWD/$build/host-site
  missing=()
  for pair in tvm_ffi:apache-tvm-ffi==$tvm_ffi pynvml:nvidia-ml-py tqdm:tqdm tabulate:tabulate \
      click:click einops:einops jinja2:jinja2 requests:requests packaging:packaging; do
    PYTHONPATH=$host_site${PYTHONPATH:+:$PYTHONPATH} python3 -c "import ${pair%%:*}" 2>/dev/null \
      || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    python3 -m pip install -q --no-deps --target "$host_site" "${missing[@]}"
  fi
  python3 scripts/slim_flashinfer_wheel.py "$build/$wheel" "$dest" --host-site "$host_site"
fi

compgen -G "$dest/apache_tvm_ffi-*.whl" >/dev/null \
  || python3 -m pip download -q --no-deps "${py312[@]}" -d "$dest" "apache-tvm-ffi==$tvm_ffi"
mkdir -p "$dest/fallback"
for name in nvidia_ml_py tqdm tabulate; do
  compgen -G "$dest/fallback/$name-*.whl" >/dev/null \
    || python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest/fallback" "${name//_/-}"
done

if [ ! -f "$dest/cuda-headers.tar.gz" ]; then
  # CUDA 13's cuRAND, cuBLAS and NVTX wheels keep their headers in nvidia/cu13/include/: only
  # those leave this machine. Versions of CUDA 13.0's time, like the GPU image's nvcc.
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$build/nvidia" \
    nvidia-curand==10.4.0.35 nvidia-cublas==13.1.1.3 nvidia-nvtx==13.0.85
  python3 - "$build/nvidia" "$dest/cuda-headers.tar.gz" <<'EOF'
import io, sys, tarfile, zipfile
from pathlib import Path

src, out = Path(sys.argv[1]), sys.argv[2]
with tarfile.open(out, "w:gz") as tar:
    for wheel in sorted(src.glob("nvidia_*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if "/include/" in info.filename and not info.is_dir():
                    name = "include/" + info.filename.split("/include/", 1)[1]
                    entry = tarfile.TarInfo(name)
                    data = zf.read(info)
                    entry.size, entry.mode = len(data), 0o644
                    tar.addfile(entry, io.BytesIO(data))
EOF
  rm -rf "$build/nvidia"  # ~480 MB of libraries, needed no more
fi

read -r tree peer < <(carried)
fi072=$(du -sb "$dest" | cut -f1)
awk -v t="$tree" -v p="$((peer + fi072))" -v f="$fi072" 'BEGIN {
  m = 1048576; total = t + p
  printf "FlashInfer 0.7.2 in .peer/fi072: %.1f MiB; .peer/: %.1f MiB; working tree: %.1f MiB; carried in all: %.1f MiB of 64 MiB%s\n",
    f / m, p / m, t / m, total / m, (total > 64 * m ? " -- OVER THE LIMIT: carry less (FI072=0, RAY=0, no JIT caches)" : "")
}'
