"""Triton solutions on a CPU: checked in Triton's interpreter, reported correct but not timed
(bench/interpreter.py); bfloat16 definitions SKIPPED saying why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _bench_helpers import make_dataset

from flashtune import platform
from flashtune.bench.build import MissingRequirement
from flashtune.bench.config import BenchConfig
from flashtune.bench.interpreter import (
    CORRECT_NOT_TIMED,
    draws_for,
    interpreted,
    launches_text,
    uninterpretable,
)
from flashtune.data import (
    Correctness,
    Dataset,
    Definition,
    EvaluationStatus,
    Solution,
    Trace,
    correct_not_timed,
)
from flashtune.report.render import status_text
from flashtune.report.tables import summarize

CPU = torch.device("cpu")
needs_triton = pytest.mark.skipif(platform.triton_version() is None, reason="Triton not installed")


def _definition(dtype: str) -> Definition:
    return Definition.model_validate(
        {
            "name": f"toy_scale_{dtype}_h8",
            "op_type": "toy",
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
            "inputs": {
                "x": {"shape": ["n", "h"], "dtype": dtype},
                "w": {"shape": ["h"], "dtype": dtype},
            },
            "outputs": {"y": {"shape": ["n", "h"], "dtype": dtype}},
            "reference": "import torch\n\ndef run(x, w):\n    return x * w\n",
        }
    )


# y = x * w * FACTOR, row by row, in a Triton kernel (FACTOR 1.01: 1% off, wrong).
KERNEL = """import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, w_ptr, y_ptr, H: tl.constexpr, FACTOR: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, H)
    x = tl.load(x_ptr + row * H + cols).to(tl.float32)
    w = tl.load(w_ptr + cols).to(tl.float32)
    tl.store(y_ptr + row * H + cols, (x * w * FACTOR).to(y_ptr.dtype.element_ty))


def run(x, w):
    y = torch.empty_like(x)
    scale_kernel[(x.shape[0],)](x, w, y, H=x.shape[1], FACTOR=%s)
    return y
"""


def _triton_solution(name: str, definition: str, factor: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition,
            "author": "tests",
            "spec": {
                "language": "triton",
                "target_hardware": ["cuda"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": KERNEL % factor}],
        }
    )


def test_which_solutions_run_in_the_interpreter() -> None:
    f16, bf16 = _definition("float16"), _definition("bfloat16")
    triton_sol = _triton_solution("t", f16.name, "1.0")
    python_sol = triton_sol.model_copy(update={"spec": triton_sol.spec.model_copy()})
    python_sol.spec.language = "python"
    assert uninterpretable(f16) == []
    assert uninterpretable(bf16) == ["x (bfloat16)", "w (bfloat16)", "y (bfloat16)"]
    assert not interpreted(f16, python_sol, CPU)  # python solutions run as they are
    assert not interpreted(f16, triton_sol, torch.device("cuda"))  # a GPU times them
    if platform.triton_version() is None:
        return
    assert interpreted(f16, triton_sol, CPU)
    with pytest.raises(MissingRequirement, match="reads bfloat16 values wrong"):
        interpreted(bf16, triton_sol, CPU)


def test_interpreter_draws_are_bounded_by_time_and_counts() -> None:
    # 8 s at 0.25 s a draw: 32; at 1.3 s: the floor; never above the sampling draws.
    assert draws_for(0.25, 8.0, 10, 200) == 32
    assert draws_for(1.3, 8.0, 10, 200) == 10
    assert draws_for(0.001, 8.0, 10, 200) == 200
    assert draws_for("fast", 8.0, 10, 200) == 10  # the sandbox's figure is untrusted
    assert draws_for(0.5, 8.0, 10, 5) == 5


def test_launches_text_names_kernels_or_their_absence() -> None:
    assert launches_text({"sampling_kernel": 3}) == "Triton kernel launches: 3 x sampling_kernel"
    assert "no Triton kernel launched" in launches_text({})
    assert launches_text(None) == "Triton launches unknown"


def test_skipped_may_carry_correctness_and_means_correct_not_timed() -> None:
    record = {
        "definition": "d",
        "workload": {"uuid": "w", "axes": {}},
        "solution": "s",
        "evaluation": {
            "status": "SKIPPED",
            "timestamp": "t",
            "reason": f"{CORRECT_NOT_TIMED} (...)",
            "correctness": Correctness(max_absolute_error=0.0).to_dict(),
        },
    }
    trace = Trace.model_validate(record)
    assert correct_not_timed(trace.evaluation)
    (summary,) = summarize([trace])
    assert summary.correct_untimed == 1
    assert "1 correct, not timed" in status_text(summary)
    record["evaluation"]["correctness"] = None
    assert not correct_not_timed(Trace.model_validate(record).evaluation)
    # a performance stays refused for SKIPPED: it was not timed
    record["evaluation"]["performance"] = {"latency_ms": 1.0}
    with pytest.raises(ValueError, match="must not include performance"):
        Trace.model_validate(record)


@pytest.mark.slow  # a worker, a spawned sandbox per solution code: ~15 s on two cores
@needs_triton
def test_cpu_run_checks_triton_solutions_in_the_interpreter(tmp_path: Path) -> None:
    from flashtune.bench.runner import RunOptions, run_benchmark

    root = tmp_path / "ds"
    f16, bf16 = _definition("float16"), _definition("bfloat16")
    extra = [
        _triton_solution("triton_good", f16.name, "1.0"),
        _triton_solution("triton_wrong", f16.name, "1.01"),
    ]
    make_dataset(root, {}, sizes=[3], definition=f16, extra=extra)
    ds = Dataset(root)
    ds.add_definition(bf16)
    ds.add_workloads(bf16, [t.workload for t in Dataset(root).workloads_for(f16.name)])
    ds.add_solution(_triton_solution("triton_bf16", bf16.name, "1.0"))
    out = tmp_path / "out"
    cfg = BenchConfig(interpreter_seconds=2.0)
    result = run_benchmark(RunOptions(datasets=[root], out=out, config=cfg), progress=False)
    got = {t.solution: t.evaluation for t in result.traces}
    assert set(got) == {"triton_good", "triton_wrong", "triton_bf16"}

    good = got["triton_good"]
    assert good is not None and correct_not_timed(good), good
    assert good.status is EvaluationStatus.SKIPPED and good.performance is None
    assert good.reason is not None and good.reason.startswith(CORRECT_NOT_TIMED)
    assert "scale_kernel" in good.reason  # the kernel really ran in the interpreter
    assert good.correctness is not None and good.correctness.max_absolute_error == 0.0
    # the sandbox was isolated as every other one (the worker's probe)
    assert "less isolated" not in (good.reason or "")

    wrong = got["triton_wrong"]
    assert wrong is not None and wrong.status is EvaluationStatus.INCORRECT_NUMERICAL
    assert "interpreter" in (wrong.reason or "")

    bf = got["triton_bf16"]
    assert bf is not None and bf.status is EvaluationStatus.SKIPPED and not correct_not_timed(bf)
    assert "bfloat16" in (bf.reason or "")

    # Written to skipped/ (FlashInfer-Bench does not read it) and read back as such.
    back = {t.solution: t.evaluation for t in Dataset(out).all_traces()}
    assert correct_not_timed(back["triton_good"])


@pytest.mark.slow  # a spawned sandbox, sampling kernels in the interpreter: ~10 s
@needs_triton
def test_flashtune_sampler_is_correct_not_timed_in_the_interpreter() -> None:
    """flashtune's own Triton sampler (the bundled solution's code) at a small vocabulary:
    its first call, a sample of new values and its draws checked in the interpreter."""
    from flashtune.bench.evaluate import evaluate_workload
    from flashtune.cli.common import bundled_dataset
    from flashtune.data import Workload

    bundled = Dataset(bundled_dataset())
    name = "top_k_sampling_from_probs_v128256"
    (definition,) = [d for d in bundled.find_definitions() if d.name == name]
    record = definition.to_dict()
    record["name"] = "top_k_sampling_from_probs_v1024"
    record["axes"]["vocab_size"]["value"] = 1024
    small = Definition.model_validate(record)
    (solution,) = [s for s in bundled.solutions_for(name) if s.name.startswith("flashtune@")]
    solution = solution.model_copy(update={"definition": small.name})
    cfg = BenchConfig(interpreter_seconds=1.0, interpreter_min_draws=20)
    events = evaluate_workload(
        small,
        Workload(uuid="w", axes={"batch_size": 2}),
        [solution],
        cfg,
        CPU,
        platform.snapshot("cpu"),
    )
    (trace,) = [t for kind, t in events if kind == "trace"]
    ev = trace.evaluation
    assert ev is not None and correct_not_timed(ev), ev and ev.reason
    assert ev.reason is not None and "20 draws checked by distribution" in ev.reason
    assert "sampling_kernel" in ev.reason  # flashtune's Triton kernel, interpreted


def test_a_run_without_triton_launches_is_not_correct_not_timed() -> None:
    """flashtune's GEMM takes torch's path on a CPU: right outputs, but no kernel was checked,
    so the trace must not say "correct, not timed"."""
    import time as _time

    import torch as _torch

    from flashtune.bench.checked_timing import WorkerSamples
    from flashtune.bench.config import BenchConfig
    from flashtune.bench.correctness import Verdict
    from flashtune.bench.interpreter import interpreted_outcome
    from flashtune.data.models import Correctness, EvaluationStatus

    class _Workload:
        floats: list[str] = []

    config = BenchConfig().for_device(_torch.device("cpu"))
    samples = WorkerSamples(_Workload(), config, "s", None, cpu=True, interpret=True)  # type: ignore[arg-type]
    samples.started = _time.monotonic()
    samples.times_ms = [1.0]
    passed = Verdict(EvaluationStatus.PASSED, None, Correctness())
    samples.launches = {}
    reason, _, verdict = interpreted_outcome(samples, passed, stochastic=False)
    assert verdict.status is EvaluationStatus.SKIPPED and verdict.correctness is None
    assert reason.startswith("ran no Triton kernel on the CPU")
    samples.launches = {"_rmsnorm_kernel": 2}
    reason, _, verdict = interpreted_outcome(samples, passed, stochastic=False)
    assert verdict.correctness is not None and "2 x _rmsnorm_kernel" in reason
