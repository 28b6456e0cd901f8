"""Loading solutions, apply() and its decorator, enable_apply on schema'd ops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _apply_helpers import GEMM_SRC, NORM_SRC, add_definition, add_traces, calls_of, plant, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from _capture_toys import toy_gemm, toy_gemm_ref, toy_norm, toy_norm_ref  # noqa: E402

import flashtune  # noqa: E402
from flashtune.apply import ApplyRuntime, apply, enable_apply, load_solution  # noqa: E402
from flashtune.apply.runtime import UnsupportedSolution  # noqa: E402
from flashtune.data import Dataset, Solution  # noqa: E402

GEMM = "toy_gemm_n8_k4"


@pytest.fixture
def gemm_ds(tmp_path: Path) -> tuple[Dataset, Solution]:
    ds = Dataset(tmp_path / "ds")
    add_definition(ds, toy_gemm.definition(torch.randn(2, 4), torch.randn(8, 4)))
    sol = plant(ds, GEMM, "planted", GEMM_SRC)
    add_traces(ds, [trace(GEMM, "planted", {"M": 4}, 0.1, abs_err=0.0)])
    return ds, sol


def test_load_importable_and_file_solutions(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    importable = Solution.model_validate(
        {
            "name": "s",
            "definition": "d",
            "author": "a",
            "spec": {"language": "python", "entry_point": "math:sqrt"},
        }
    )
    assert load_solution(importable)(4.0) == 2.0
    multi = Solution.model_validate(
        {
            "name": "m",
            "definition": "d",
            "author": "a",
            "spec": {
                "language": "triton",
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [
                {
                    "path": "main.py",
                    "content": "from helper import K\n\ndef run(x):\n    return x * K\n",
                },
                {"path": "helper.py", "content": "K = 3\n"},
            ],
        }
    )
    assert load_solution(multi)(2) == 6
    assert list((tmp_path / "cache" / "apply" / "solutions").glob("*/helper.py"))
    cuda = Solution.model_validate(
        {
            "name": "c",
            "definition": "d",
            "author": "a",
            "spec": {"language": "cuda", "entry_point": "k.cu::run"},
            "sources": [{"path": "k.cu", "content": "//"}],
        }
    )
    with pytest.raises(UnsupportedSolution):
        load_solution(cuda)


def test_apply_function_and_fallback(gemm_ds) -> None:
    ds, sol = gemm_ds
    a, b = torch.randn(3, 4), torch.randn(8, 4)
    out = apply(GEMM, {"A": a, "B": b}, fallback=None, dataset=ds.root)
    torch.testing.assert_close(out, toy_gemm_ref(a, b))
    assert calls_of(sol)[-1] == (3, 4)
    # a definition the table does not know: the fallback runs
    c = torch.randn(3, 5)
    assert (
        apply(
            "toy_gemm_n8_k5", {"A": c, "B": torch.randn(8, 5)}, lambda A, B: "fb", dataset=ds.root
        )
        == "fb"
    )
    with pytest.raises(LookupError):
        apply("toy_gemm_n8_k5", {"A": c, "B": torch.randn(8, 5)}, dataset=ds.root)
    # a resolver picks the definition from the arguments
    resolver = lambda kw: f"toy_gemm_n{kw['B'].shape[0]}_k{kw['B'].shape[1]}"  # noqa: E731
    apply(resolver, {"A": a, "B": b}, dataset=ds.root)
    assert calls_of(sol)[-1] == (3, 4)


def test_apply_decorator(gemm_ds) -> None:
    ds, sol = gemm_ds
    fallback_calls = []

    @flashtune.apply(GEMM, dataset=ds.root)
    def my_gemm(A, B):
        fallback_calls.append(1)
        return A @ B.T

    n = len(calls_of(sol))
    my_gemm(torch.randn(2, 4), B=torch.randn(8, 4))
    assert len(calls_of(sol)) == n + 1 and fallback_calls == []

    @apply("unknown_definition", dataset=ds.root)
    def other(A, B):
        fallback_calls.append(1)
        return 0

    assert other(torch.randn(2, 4), torch.randn(8, 4)) == 0 and fallback_calls == [1]


def test_destination_passing_solution(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    add_definition(ds, toy_gemm.definition(torch.randn(2, 4), torch.randn(8, 4)))
    src = "def run(A, B, C):\n    C.copy_(A @ B.T)\n"
    plant(ds, GEMM, "dps", src, destination_passing_style=True)
    add_traces(ds, [trace(GEMM, "dps", {"M": 2}, 0.1)])
    a, b = torch.randn(2, 4), torch.randn(8, 4)
    with enable_apply(dataset=ds) as handle:
        torch.testing.assert_close(toy_gemm(a, b), toy_gemm_ref(a, b))
    assert handle.hook.hits == 1


def test_enable_apply_dispatches_schemad_ops_and_falls_back(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    sol = plant(ds, "toy_norm_h16", "fast", NORM_SRC)
    add_traces(ds, [trace("toy_norm_h16", "fast", {"batch_size": 4}, 0.1)])
    x, w = torch.randn(4, 16), torch.randn(16)
    handle = enable_apply(dataset=ds)
    try:
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))
        out = torch.empty(4, 16)
        assert toy_norm(x, w, out=out) is out  # out= receives the solution's result
        torch.testing.assert_close(out, toy_norm_ref(x, w))
        y = toy_norm(x.view(2, 2, 16), w)  # 3-D: leading dims merged, result reshaped back
        assert y.shape == (2, 2, 16)
        assert calls_of(sol)[-3:] == [(4, 16), (4, 16), (4, 16)]
        n = len(calls_of(sol))
        toy_norm(torch.randn(4, 8), torch.randn(8))  # toy_norm_h8: not in the table
        assert len(calls_of(sol)) == n
        assert handle.hook.hits == 3 and handle.hook.misses == 1
    finally:
        handle.disable()
    toy_norm(x, w)
    assert len(calls_of(sol)) == n  # disabled: the op's own path


def test_missing_or_unloadable_winner_falls_back(tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    add_traces(ds, [trace("toy_norm_h16", "ghost", {"batch_size": 4}, 0.1)])  # no such solution
    rt = ApplyRuntime(ds)
    assert rt.runner("toy_norm_h16", {"batch_size": 4}) is None
    x, w = torch.randn(4, 16), torch.randn(16)
    with enable_apply(dataset=ds):
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))


def test_winner_is_not_used_for_another_dtype(tmp_path: Path, caplog) -> None:
    # Definition names carry no dtype: toy_norm_h16 here is float32 (its inputs' dtypes), so
    # a float16 call of the same name and shapes must not get the float32 winner.
    ds = Dataset(tmp_path)
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    sol = plant(ds, "toy_norm_h16", "fast32", NORM_SRC)
    add_traces(ds, [trace("toy_norm_h16", "fast32", {"batch_size": 4}, 0.1)])
    x, w = torch.randn(4, 16), torch.rand(16) + 0.5
    xh, wh = x.half(), w.half()
    with enable_apply(dataset=ds) as handle, caplog.at_level("WARNING", "flashtune.apply"):
        toy_norm(x, w)
        n = len(calls_of(sol))
        for _ in range(3):  # the miss is cached per signature (dtypes included)
            y = toy_norm(xh, wh)
            assert y.dtype == torch.float16
            torch.testing.assert_close(y, toy_norm_ref(xh, wh))
        assert len(calls_of(sol)) == n  # the op's own path ran
        toy_norm(x, w)  # float32 still reaches the winner
        assert len(calls_of(sol)) == n + 1
        assert handle.hook.hits == 2 and handle.hook.misses == 3
    assert sum("float16" in r.getMessage() for r in caplog.records) == 1  # logged once
    # apply(name, kwargs) checks the dtypes too
    kwargs = {"hidden_states": xh, "weight": wh}
    assert apply("toy_norm_h16", kwargs, lambda **kw: "fb", dataset=ds.root) == "fb"
    assert len(calls_of(sol)) == n + 1
    apply("toy_norm_h16", {"hidden_states": x, "weight": w}, dataset=ds.root)
    assert len(calls_of(sol)) == n + 2


def test_winner_of_a_definition_the_dataset_lacks_is_not_used(tmp_path: Path) -> None:
    # Traces without their definition: the dtypes cannot be checked, so the op's path runs.
    ds = Dataset(tmp_path)
    sol = plant(ds, "toy_norm_h16", "fast", NORM_SRC)
    add_traces(ds, [trace("toy_norm_h16", "fast", {"batch_size": 4}, 0.1)])
    x, w = torch.randn(4, 16), torch.randn(16)
    n = len(calls_of(sol))
    with enable_apply(dataset=ds) as handle:
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))
        assert handle.hook.misses == 1 and len(calls_of(sol)) == n


SELF_CALLING_SRC = """from _capture_toys import toy_norm
CALLS = []

def run(hidden_states, weight):
    CALLS.append(tuple(hidden_states.shape))
    return toy_norm(hidden_states, weight)  # the op this solution replaces
"""


def test_a_solution_calling_the_op_it_replaces_runs_it_once(tmp_path: Path) -> None:
    """flashtune's own solutions call flashtune's ops: inside a solution those calls run the
    op's own code. Routing them to the table again recursed until Python's limit, and the
    solution was disabled as broken (`flashtune e2e --loop` on the H100)."""
    from flashtune.apply.solutions import broken_solutions, clear_broken_solutions

    clear_broken_solutions()
    ds = Dataset(tmp_path)
    add_definition(ds, toy_norm.definition(torch.randn(2, 16), torch.randn(16)))
    sol = plant(ds, "toy_norm_h16", "self", SELF_CALLING_SRC)
    add_traces(ds, [trace("toy_norm_h16", "self", {"batch_size": 4}, 0.1)])
    x, w = torch.randn(4, 16), torch.randn(16)
    with enable_apply(dataset=ds) as handle:
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))
        torch.testing.assert_close(toy_norm(x, w), toy_norm_ref(x, w))
        assert handle.hook.hits == 2
    assert calls_of(sol) == [(4, 16), (4, 16)]  # once a call, not once a recursion level
    assert not broken_solutions()
