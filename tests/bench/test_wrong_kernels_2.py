"""Wrong kernels that passed with i.i.d. N(0, 1) inputs and global bounds (issue 31) now
fail, and their honest counterparts pass, through the public checks (compare_outputs,
distribution_check) on inputs from synthesize_inputs for bundled definitions.

- rmsnorm with eps 1000x too large: rows of scale 10^-3..10^2 (data/families.py) make the
  small rows' outputs wrong by up to 97%;
- a GEMM wrong only on its small-scale rows (zero where the row's largest |A| is under 1% of
  the tensor's, as an underflowing low-precision path gives): the whole-tensor norm barely
  moves, the per-row norm is 1.0;
- a norm that zeroes one row of 2048 or scales it by 1.1 (the old "known limit");
- samplers: top-k keeping k - 1 tokens, top-p with p - 0.1, argmax at batch 1, each at the
  CPU's draw count (BenchConfig.for_device: 200), checked by the exact allowed sets and the
  edge test of bench/sampling_support.py (their power: docs/evaluation.md).
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from flashtune.bench import entry_points
from flashtune.bench.config import BenchConfig
from flashtune.bench.correctness import DEFAULT_TOLERANCES, compare_outputs, distribution_check
from flashtune.bench.sampling_support import (
    EDGE_ALPHA,
    edge_powers,
    edge_problem,
    filters_from,
    support_problem,
)
from flashtune.cli import bundled_dataset
from flashtune.data import (
    Dataset,
    Definition,
    EvaluationStatus,
    compile_reference,
    outputs_as_dict,
    synthesize_inputs,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _sampling_draws import kept  # noqa: E402

DS = Dataset(bundled_dataset())
CPU_DRAWS = BenchConfig().for_device(torch.device("cpu")).sampling_draws
BF16_ROW = DEFAULT_TOLERANCES["bfloat16"].max_row_rel_norm


@cache
def _definition(name: str) -> Definition:
    return DS.definition(name)


def _inputs(name: str, index: int, seed: int) -> dict[str, Any]:
    d = _definition(name)
    return synthesize_inputs(d, DS.workloads_for(name)[index].workload, seed=seed, blob_root=DS)


def _run(d: Definition, x: dict[str, Any], old: str = "", new: str = "") -> dict[str, Any]:
    source = d.reference
    if old:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<kernel of {d.name}>", "exec"), namespace)  # noqa: S102
    return outputs_as_dict(d, namespace["run"](**x))


# ------------------------------------------------------------------- rmsnorm: eps x1000

NORMS = ["rmsnorm_h4096", "fused_add_rmsnorm_h4096", "rmsnorm_h8192", "fused_add_rmsnorm_h8192"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NORMS)
def test_rmsnorm_with_eps_1000x_too_large_fails(name):
    d = _definition(name)
    assert "eps=1e-05" in d.reference
    for index in (1, 2):  # 16 and 64 rows: the stratified scales reach below 10^-2
        for seed in range(3):
            x = _inputs(name, index, seed)
            ref = _run(d, x)
            honest = compare_outputs(d, ref, _run(d, x, "eps=1e-05", "eps=1e-05 * 1.0"))
            assert honest.status is EvaluationStatus.PASSED, honest.reason
            torch_norm = (
                entry_points.torch_fused_add_rmsnorm
                if "residual" in x
                else entry_points.torch_rmsnorm
            )
            eager = outputs_as_dict(d, torch_norm(*[x[k] for k in d.inputs]))
            assert compare_outputs(d, ref, eager).status is EvaluationStatus.PASSED
            wrong = compare_outputs(d, ref, _run(d, x, "eps=1e-05", "eps=1e-02"))
            assert wrong.status is EvaluationStatus.INCORRECT_NUMERICAL, (index, seed)
            assert wrong.correctness.row_rel_norm_error > 0.5  # the smallest rows, ~10^-3
            assert wrong.correctness.rel_norm_error > 0.1


def test_rmsnorm_eps_once_passed_with_unit_rows():
    """As found: with N(0, 1) rows (rms 1 >> sqrt(eps)) the wrong eps moves the output by
    0.5%, within the bf16 bounds."""
    d = _definition("rmsnorm_h4096")
    g = torch.Generator().manual_seed(0)
    x = {"hidden_states": torch.randn(64, 4096, generator=g).bfloat16()}
    x["weight"] = torch.randn(4096, generator=g).bfloat16()
    verdict = compare_outputs(d, _run(d, x), _run(d, x, "eps=1e-05", "eps=1e-02"))
    assert verdict.status is EvaluationStatus.PASSED
    assert verdict.correctness.rel_norm_error < 1e-2


# ------------------------------------------------------- gemm: wrong on small rows only


def _small_rows(a: torch.Tensor) -> torch.Tensor:
    """Rows whose largest |A| is under 1% of the tensor's: [M, 1]."""
    row_max = a.abs().amax(-1, keepdim=True)
    return row_max < 0.01 * a.abs().max()


def _small_rows_flushed(x: dict[str, Any]) -> dict[str, Any]:
    """Right, except that small rows come out zero (an underflowing low-precision path)."""
    a = x["A"].float()
    a = torch.where(_small_rows(a), 0.0, a)
    return {"C": (a @ x["B"].float().T).to(x["A"].dtype)}


def test_gemm_wrong_only_on_small_rows_fails():
    name = "gemm_n1280_k8192"
    d = _definition(name)
    for seed in range(3):
        x = _inputs(name, 2, seed)  # M = 64: rows 10^-3 .. 10^1
        assert bool(_small_rows(x["A"].float()).any())
        ref = _run(d, x)
        honest = compare_outputs(
            d, ref, outputs_as_dict(d, entry_points.torch_gemm(x["A"], x["B"]))
        )
        assert honest.status is EvaluationStatus.PASSED, honest.reason
        flushed = compare_outputs(d, ref, _small_rows_flushed(x))
        assert flushed.status is EvaluationStatus.INCORRECT_NUMERICAL
        assert flushed.correctness.row_rel_norm_error == pytest.approx(1.0)
    # With N(0, 1) rows, as before, no row is small: the kernel is right, and passes.
    g = torch.Generator().manual_seed(0)
    x = {"A": torch.randn(64, 8192, generator=g).half(), "B": _inputs(name, 2, 0)["B"]}
    assert not bool(_small_rows(x["A"].float()).any())
    assert compare_outputs(d, _run(d, x), _small_rows_flushed(x)).status.value == "PASSED"


# ----------------------------------------------------------- one row of 2048, norm


@pytest.mark.slow
@pytest.mark.parametrize("how", ["zeros", "x1.1"])
def test_a_norm_wrong_on_one_row_of_2048_fails(how):
    name = "rmsnorm_h4096"
    d = _definition(name)
    x = _inputs(name, 4, 0)  # 2048 rows
    ref = _run(d, x)
    out = ref["output"].clone()
    row = 2048 // 3
    out[row] = 0 if how == "zeros" else (out[row].float() * 1.1).bfloat16()
    verdict = compare_outputs(d, ref, {"output": out})
    assert verdict.status is EvaluationStatus.INCORRECT_NUMERICAL
    assert verdict.correctness.matched_ratio >= 0.999  # within the element-wise tolerance
    if how == "zeros":  # 1 / sqrt(2048) of the whole norm (rows of like norms): 2.2e-2
        assert verdict.correctness.row_rel_norm_error == pytest.approx(1.0)
    else:  # the old known limit: 2.2e-3 of the whole norm, 0.1 of its row
        assert f"row [{row}]" in verdict.reason
        assert verdict.correctness.rel_norm_error < 1e-2
        assert verdict.correctness.row_rel_norm_error == pytest.approx(0.1, rel=0.05)


# ------------------------------------------------------------------- samplers

TOP_K = "top_k_sampling_from_probs_v128256"
TOP_P = "top_p_sampling_from_probs_v128256"
TOP_K_TOP_P = "top_k_top_p_sampling_from_probs_v128256"


def _sampler(x: dict[str, Any], seed: int, draws: int, **shift: float):
    """Draws from the exact filtered distribution of each row (tests/_sampling_draws.kept:
    an independent implementation of the filters), its parameters shifted by `shift`."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(x["probs"].shape[0]):
        k = int(x["top_k"][r]) + int(shift.get("top_k", 0)) if "top_k" in x else 0
        p = float(x["top_p"][r]) + shift.get("top_p", 0.0) if "top_p" in x else 1.0
        w = kept(x["probs"][r : r + 1], top_k=k, top_p=max(p, 0.0), joint=False)
        rows.append(torch.multinomial(w.float(), draws, replacement=True, generator=gen))
    samples = iter(torch.stack(rows).T)
    return lambda: {"samples": next(samples)}


def _argmax(x: dict[str, Any]):
    return lambda: {"samples": x["probs"].argmax(-1)}


@cache
def _case(name: str, index: int, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Inputs and CPU_DRAWS draws of the definition's reference on them (once per case)."""
    d = _definition(name)
    x = _inputs(name, index, seed)
    run = compile_reference(d)
    torch.manual_seed(seed)
    return x, [outputs_as_dict(d, run(**x)) for _ in range(CPU_DRAWS)]


def _check(name: str, index: int, seed: int, kind: str):
    d = _definition(name)
    x, reference = _case(name, index, seed)
    solution = {
        "honest": lambda: _sampler(x, 1000 + seed, CPU_DRAWS),
        "k-1": lambda: _sampler(x, 1000 + seed, CPU_DRAWS, top_k=-1),
        "p-0.1": lambda: _sampler(x, 1000 + seed, CPU_DRAWS, top_p=-0.1),
        "argmax": lambda: _argmax(x),
    }[kind]()
    return distribution_check(d, solution, iter(reference).__next__, draws=CPU_DRAWS, inputs=x)


def _predicted(name: str, index: int, seed: int, edge: str) -> bool:
    """Whether the edge test alone must catch a sampler that never lands on `edge`: the
    stated power (bench/sampling_support.py: sum_r n * -log(1 - q_r) > log(edges / alpha))."""
    x, _ = _case(name, index, seed)
    f = filters_from(x, x["probs"].shape[0])
    assert f is not None
    powers = edge_powers(f)
    q = powers[edge].clamp(max=1 - 1e-12)
    return CPU_DRAWS * float(-torch.log1p(-q).sum()) > math.log(len(powers) / EDGE_ALPHA)


# (definition, workload index: 0 = batch 1, 1 = batch 4, wrong kind)
WRONG_SAMPLERS = [
    (TOP_K, 0, "k-1"),
    (TOP_K, 1, "k-1"),
    (TOP_P, 0, "p-0.1"),
    (TOP_P, 1, "p-0.1"),
    (TOP_K_TOP_P, 0, "k-1"),
    (TOP_K_TOP_P, 1, "k-1"),
    (TOP_K_TOP_P, 1, "p-0.1"),
    (TOP_K, 0, "argmax"),
    (TOP_P, 0, "argmax"),
    (TOP_K_TOP_P, 0, "argmax"),
]
_EDGE = {"k-1": "top_k", "p-0.1": "top_p", "argmax": "mode"}
SEEDS = {0: range(3), 1: range(2)}  # input sets per batch size (the reference's draws cost)


def test_the_cpu_draw_count_is_the_one_the_power_is_stated_for():
    assert CPU_DRAWS == 200
    assert BenchConfig().for_device(torch.device("cuda")).sampling_draws == 1000


@pytest.mark.parametrize(
    "name, index, kind",
    [
        # A minute or two each on two CPU cores (200 draws of the reference over 128k tokens,
        # per input set, and since issue 33 the CPU's stated spread and flashtune's sampler in
        # the interpreter): CI's slow step runs them (the main suite keeps
        # test_evaluate.py's sampling check).
        pytest.param(n, i, k, marks=pytest.mark.slow)
        for n, i, k in WRONG_SAMPLERS
    ],
    ids=[f"{n[:14]}-b{4**i}-{k}" for n, i, k in WRONG_SAMPLERS],
)
def test_wrong_sampler_fails_and_honest_passes(name, index, kind):
    caught = 0
    for seed in SEEDS[index]:
        honest = _check(name, index, seed, "honest")
        assert honest.status is EvaluationStatus.PASSED, (seed, honest.reason)
        wrong = _check(name, index, seed, kind)
        caught += wrong.status is EvaluationStatus.INCORRECT_NUMERICAL
        if _predicted(name, index, seed, _EDGE[kind]):  # the stated power: caught for sure
            assert wrong.status is EvaluationStatus.INCORRECT_NUMERICAL, (seed, kind)
    # batch 4: every input set; batch 1: most (docs/evaluation.md, "Sampling")
    seeds = len(SEEDS[index])
    assert caught == seeds if index == 1 else caught >= seeds - 1


def test_the_edge_test_alone_catches_each_wrong_sampler_at_batch_1():
    """The guarantee behind the statement of power: the wrong samplers never land on their
    edge, and at 200 draws the edge's honest share makes that implausible (P < 1e-6)."""
    for name, kind, shift in [
        (TOP_K, "top_k", {"top_k": -1}),
        (TOP_P, "top_p", {"top_p": -0.1}),
        (TOP_K, "mode", None),
    ]:
        x = _inputs(name, 0, 0)
        f = filters_from(x, 1)
        assert f is not None
        sampler = _argmax(x) if shift is None else _sampler(x, 7, CPU_DRAWS, **shift)
        draws = torch.stack([sampler()["samples"] for _ in range(CPU_DRAWS)], 1)
        assert support_problem(draws, f) is None  # inside the allowed set: a subset of it
        problem = edge_problem(draws, f)
        assert problem is not None and f"0 of {CPU_DRAWS} draws" in problem, (kind, problem)


def test_a_draw_outside_the_top_k_set_fails_at_once():
    x = _inputs(TOP_K, 1, 0)
    f = filters_from(x, 4)
    assert f is not None
    k = int(x["top_k"][0])
    outside = torch.topk(x["probs"][0], k + 1).indices[k]  # the (k+1)-th: a near tie
    sampler = _sampler(x, 3, CPU_DRAWS)
    draws = torch.stack([sampler()["samples"] for _ in range(CPU_DRAWS)], 1)
    draws[0, 5] = outside
    problem = support_problem(draws, f)
    assert problem is not None and "outside the allowed set" in problem
    assert f"rank {k + 1}" in problem
