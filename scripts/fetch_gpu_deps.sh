#!/usr/bin/env bash
# Fill the ignored folder .peer/ with what a GPU machine of the `device` tool lacks (it has no
# network): FlashInfer 0.2.14.post1's source archive (the peer in every benchmark) with its
# loader script, and Python 3.12 wheels of pydantic (flashtune's data model) and friends.
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
  python3 -m pip download -q --no-deps --no-binary :all: flashinfer-python==0.2.14.post1 -d .peer
fi
[ -f .peer/flashinfer-from-sdist.sh ] || cp ../shared/gpu/flashinfer-from-sdist.sh .peer/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .peer/wheels pydantic pydantic-core annotated-types typing-inspection typing-extensions filelock safetensors
ls -la .peer .peer/wheels
