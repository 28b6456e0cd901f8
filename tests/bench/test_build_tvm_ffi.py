"""CUDA / C++ solutions bound with TVM-FFI (FlashInfer-Bench's default binding, issue 36): which
builder a solution takes, the requirement named when apache-tvm-ffi is missing, and (slow: a
C++ compile) a FlashInfer-Bench-style C++ solution evaluated end to end in destination-passing
style: the right one PASSES, a wrong one is INCORRECT, a broken one is a COMPILE_ERROR with the
compiler's log, an unexported symbol is named."""

from __future__ import annotations

import pytest
import torch
from _bench_helpers import toy_definition

from flashtune import platform
from flashtune.bench import build as build_module
from flashtune.bench.build import MissingRequirement, check_requirements
from flashtune.bench.build_tvm_ffi import tvm_ffi_available, uses_tvm_ffi
from flashtune.bench.evaluate import BenchConfig, evaluate_workload
from flashtune.data import Solution, Workload

# y[i, j] = x[i, j] * w[j], as toy_definition's reference; inputs then the output (DPS).
SOURCE = """
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  TVM_FFI_ICHECK(x.ndim() == 2 && w.ndim() == 1 && y.ndim() == 2) << "ranks";
  const int64_t n = x.size(0), h = x.size(1);
  const float* xp = static_cast<const float*>(x.data_ptr());
  const float* wp = static_cast<const float*>(w.data_ptr());
  float* yp = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j) yp[i * h + j] = xp[i * h + j] * wp[j]{wrong};
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, scale);
"""


def _solution(name: str, content: str, binding: str | None = "tvm-ffi", **spec) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "toy_scale_h8",
            "author": "tests",
            "spec": {
                "language": "cpp",
                "target_hardware": ["cpu"],
                "entry_point": "kernel.cpp::scale",
                "destination_passing_style": True,
                **({"binding": binding} if binding else {}),
                **spec,
            },
            "sources": [{"path": "kernel.cpp", "content": content}],
        }
    )


def test_the_binding_chooses_the_builder() -> None:
    plain = "torch::Tensor scale(torch::Tensor x) { return x; }"
    assert uses_tvm_ffi(_solution("a", plain, "tvm-ffi"))
    assert not uses_tvm_ffi(_solution("b", SOURCE, "torch"))
    # absent: FlashInfer-Bench's default (TVM-FFI) for sources that use it, else load_inline
    assert uses_tvm_ffi(_solution("c", SOURCE, None))
    assert not uses_tvm_ffi(_solution("d", plain, None))


def test_a_missing_tvm_ffi_is_a_named_requirement(monkeypatch) -> None:
    monkeypatch.setattr(build_module, "tvm_ffi_available", lambda: False)
    with pytest.raises(MissingRequirement, match="apache-tvm-ffi"):
        check_requirements(_solution("a", SOURCE), torch.device("cpu"))
    check_requirements(_solution("b", SOURCE, "torch"), torch.device("cpu"))  # not needed


@pytest.mark.slow
@pytest.mark.skipif(not tvm_ffi_available(), reason="needs apache-tvm-ffi (pip install)")
def test_tvm_ffi_solutions_are_built_and_judged() -> None:
    definition = toy_definition()
    solutions = [
        _solution("right", SOURCE.replace("{wrong}", "").replace("{export}", "scale")),
        _solution("wrong", SOURCE.replace("{wrong}", " + 0.5f").replace("{export}", "scale")),
        _solution("broken", SOURCE.replace("{wrong}", " +").replace("{export}", "scale")),
        _solution("unexported", SOURCE.replace("{wrong}", "").replace("{export}", "other")),
    ]
    events = evaluate_workload(
        definition,
        Workload(uuid="w", axes={"n": 5}),
        solutions,
        BenchConfig(warmup=1, iterations=3, trials=1),
        torch.device("cpu"),
        platform.snapshot("cpu"),
    )
    got = {t.solution: t.evaluation for kind, t in events if kind == "trace"}
    assert got["right"].status.value == "PASSED", got["right"].log
    assert got["wrong"].status.value == "INCORRECT_NUMERICAL"
    assert got["broken"].status.value == "COMPILE_ERROR" and "error" in got["broken"].log.lower()
    assert got["unexported"].status.value == "COMPILE_ERROR"
    assert "'scale'" in got["unexported"].log or "scale" in (got["unexported"].reason or "")


# The CUDA form FlashInfer-Bench's TVM-FFI solutions take: a kernel launched on the stream the
# caller's framework has current (TVMFFIEnvGetStream), in destination-passing style.
CUDA_SOURCE = """
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

__global__ void scale_kernel(const float* x, const float* w, float* y, int64_t n, int64_t h) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n * h) y[i] = x[i] * w[i % h]{wrong};
}

void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  TVM_FFI_ICHECK(x.ndim() == 2 && w.ndim() == 1 && y.ndim() == 2) << "ranks";
  const int64_t n = x.size(0), h = x.size(1);
  cudaStream_t stream = static_cast<cudaStream_t>(
      TVMFFIEnvGetStream(x.device().device_type, x.device().device_id));
  const int threads = 256;
  const int64_t blocks = (n * h + threads - 1) / threads;
  if (blocks > 0)
    scale_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(x.data_ptr()), static_cast<const float*>(w.data_ptr()),
        static_cast<float*>(y.data_ptr()), n, h);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);
"""


@pytest.mark.cuda
@pytest.mark.skipif(not tvm_ffi_available(), reason="needs apache-tvm-ffi (pip install)")
def test_tvm_ffi_cuda_solutions_are_built_and_judged_on_the_gpu() -> None:
    def cuda(name: str, wrong: str) -> Solution:
        raw = _solution(name, CUDA_SOURCE.replace("{wrong}", wrong)).model_dump(mode="json")
        raw["spec"].update(language="cuda", target_hardware=["cuda"], entry_point="k.cu::scale")
        raw["sources"][0]["path"] = "k.cu"
        return Solution.model_validate(raw)

    events = evaluate_workload(
        toy_definition(),
        Workload(uuid="w", axes={"n": 1031}),
        [cuda("right", ""), cuda("wrong", " + 0.5f")],
        BenchConfig(warmup=1, iterations=3, trials=1),
        torch.device("cuda"),
        platform.snapshot("cuda"),
    )
    got = {t.solution: t.evaluation for kind, t in events if kind == "trace"}
    assert got["right"].status.value == "PASSED", (got["right"].reason, got["right"].log)
    assert got["wrong"].status.value == "INCORRECT_NUMERICAL", got["wrong"].reason
