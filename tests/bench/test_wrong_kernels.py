"""Wrong kernels fail and honest ones pass, on the bundled definitions and their workloads.

Each wrong kernel perturbs the definition's own reference: its inputs (pages dropped, a
wrong softmax scale), its source (the causal mask shifted by one) or its outputs (an LSE
offset, a head set to 100.0, zeros). The honest kernels are the reference itself and an
emulation of a bf16 attention kernel as FlashInfer and flashtune run it: logits from bf16
q and k summed in fp32, an online base-2 softmax over blocks of 64 keys, P rounded to bf16
before the PV product, fp32 accumulators. All on CPU, a few seconds in all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch

from flashtune.bench import entry_points
from flashtune.bench.correctness import compare_outputs
from flashtune.cli import bundled_dataset
from flashtune.data import (
    Dataset,
    Definition,
    EvaluationStatus,
    Workload,
    outputs_as_dict,
    synthesize_inputs,
)
from flashtune.data.synth import ATTENTION_VALUE_MEAN

DS = Dataset(bundled_dataset())
DECODE = "gqa_paged_decode_h32_kv8_d128_ps16"
DECODE_H8 = "gqa_paged_decode_h8_kv1_d128_ps16"
PAGED_PREFILL = "gqa_paged_prefill_causal_h32_kv8_d128_ps16"
RAGGED_PREFILL = "gqa_ragged_prefill_causal_h32_kv8_d128"
PAGE = 16

# Workloads: the smallest bundled one of each definition, plus two built here.
WORKLOADS: dict[str, tuple[str, Workload | None]] = {
    "decode": (DECODE, None),
    "paged_prefill": (PAGED_PREFILL, None),
    "ragged_prefill": (RAGGED_PREFILL, None),
    # 64 requests of about 2 pages each: one request-head is 1 of 2048.
    "decode_b64": (
        DECODE,
        Workload(
            uuid="b64",
            axes={"batch_size": 64, "len_indptr": 65, "num_kv_indices": 128, "num_pages": 160},
        ),
    ),
    # One request of 2048 pages, about 32k tokens (one KV head keeps the reference fast).
    "decode_32k": (
        DECODE_H8,
        Workload(
            uuid="32k",
            axes={"batch_size": 1, "len_indptr": 2, "num_kv_indices": 2048, "num_pages": 2048},
        ),
    ),
}
# "<workload>/v0": the same with zero-mean values, as the wrong kernels were first found
# (outputs about 0.007 in size at 32k tokens): the bounds must not depend on the V offset.
ZERO_MEAN = "/v0"


def _run(definition: Definition, inputs: dict[str, Any], **source_edit: str) -> dict[str, Any]:
    return outputs_as_dict(definition, _kernel(definition, **source_edit)(**inputs))


def _kernel(definition: Definition, old: str = "", new: str = "") -> Callable[..., Any]:
    """The reference's `run`, its source edited (old -> new)."""
    source = definition.reference
    if old:
        assert source.count(old) == 1, f"{definition.name}: reference has no {old!r}"
        source = source.replace(old, new)
    namespace: dict[str, Any] = {"__name__": f"kernel_of_{definition.name}"}
    exec(compile(source, f"<kernel of {definition.name}>", "exec"), namespace)  # noqa: S102
    return namespace["run"]


@cache
def _case(key: str) -> tuple[Definition, dict[str, Any], dict[str, Any]]:
    """(definition, inputs, reference outputs), computed once per workload."""
    name, workload = WORKLOADS[key.removesuffix(ZERO_MEAN)]
    definition = DS.definition(name)
    if workload is None:
        workload = DS.workloads_for(name)[0].workload
    inputs = synthesize_inputs(definition, workload, seed=0, blob_root=DS)
    if key.endswith(ZERO_MEAN):
        v = inputs["v_cache"]
        inputs["v_cache"] = (v.float() - ATTENTION_VALUE_MEAN).to(v.dtype)
    return definition, inputs, _run(definition, inputs)


# ----------------------------------------------------------------------- the kernels


def honest_reference(d, x, ref):
    return _run(d, x)


# Where each reference forms its softmax weights P (float32): a bf16 kernel rounds P to
# bf16 before multiplying by V, and accumulates in float32.
_SOFTMAX_P = (
    "torch.exp(logits - lse_b[:, None])",
    "torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])",
)


def honest_bf16(d, x, ref):
    """An honest bf16 kernel: the reference with P rounded to bf16, as tensor-core kernels
    round it for the PV product."""
    p = next(p for p in _SOFTMAX_P if p in d.reference)
    edited = _kernel(d, old=p, new=f"({p}).to(torch.bfloat16).float()")
    out = outputs_as_dict(d, edited(**x))
    assert not torch.equal(out["output"], ref["output"]), "the rounding changed nothing"
    return out


def _skip_last_pages(count: int):
    def kernel(d, x, ref):
        # The last request loses its last `count` pages; its new last page is full.
        x = dict(x)
        ptr = x["kv_indptr"].clone()
        assert int(ptr[-1] - ptr[-2]) > count
        ptr[-1] -= count
        x["kv_indptr"], x["kv_indices"] = ptr, x["kv_indices"][: int(ptr[-1])]
        x["kv_last_page_len"] = x["kv_last_page_len"].clone()
        x["kv_last_page_len"][-1] = PAGE
        return _run(d, x)

    return kernel


def _wrong_scale(factor: float):
    def kernel(d, x, ref):
        return _run(d, {**x, "sm_scale": x["sm_scale"] * factor})

    return kernel


def _lse_offset(offset: float):
    def kernel(d, x, ref):
        return {**ref, "lse": ref["lse"] + offset}

    return kernel


def zero_output(d, x, ref):
    return {**ref, "output": torch.zeros_like(ref["output"])}


def all_zeros(d, x, ref):
    return {k: torch.zeros_like(v) for k, v in ref.items()}


def _causal_shift(shift: int):
    def kernel(d, x, ref):
        # shift +1: each query sees one key more; -1: one fewer.
        return _run(d, x, old="keep = (j <= i)", new=f"keep = (j <= i + {shift})")

    return kernel


def _longest_request(x) -> int:
    return int((x["kv_indptr"][1:] - x["kv_indptr"][:-1]).argmax())


def one_head_100(d, x, ref):
    out = ref["output"].clone()
    out[_longest_request(x), 5] = 100.0
    return {**ref, "output": out}


def one_head_wrong_scale(d, x, ref):
    b = _longest_request(x)
    start, end = int(x["kv_indptr"][b]), int(x["kv_indptr"][b + 1])
    one = {
        **x,
        "q": x["q"][b : b + 1],
        "kv_indptr": torch.tensor([0, end - start], dtype=x["kv_indptr"].dtype),
        "kv_indices": x["kv_indices"][start:end],
        "kv_last_page_len": x["kv_last_page_len"][b : b + 1],
        "sm_scale": x["sm_scale"] * 1.05,
    }
    wrong = _run(d, one)
    out, lse = ref["output"].clone(), ref["lse"].clone()
    out[b, 5], lse[b, 5] = wrong["output"][0, 5], wrong["lse"][0, 5]
    return {"output": out, "lse": lse}


HONEST = [
    (workload, kernel)
    for workload in [*WORKLOADS, "decode_32k" + ZERO_MEAN]
    for kernel in (honest_reference, honest_bf16)
]
# The four that passed before (issue 11), first with zero-mean values as found, then as
# synthesized now.
AS_FOUND = [
    (_skip_last_pages(128), "skip last 128 of 2048 pages", "decode_32k"),
    (_lse_offset(0.15), "lse + 0.15", "decode_32k"),
    (one_head_100, "one request-head 100.0", "decode_b64"),
    (zero_output, "zero output", "decode_32k"),
]
WRONG = [
    *[(w + ZERO_MEAN, k, f"{label} ({w}, zero-mean V)") for k, label, w in AS_FOUND],
    *[(w, k, f"{label} ({w})") for k, label, w in AS_FOUND],
    ("decode", _skip_last_pages(1), "skip last page"),
    # Not listed: the last page of 2048 (a 32k-token request) moves the LSE by 9.8e-4 and
    # the output by a relative norm of 9.8e-4 with V of mean 0.5, both under the bounds (the
    # LSE bound is 1e-3 because FlashInfer's decode exceeds 1e-4): a documented gap.
    ("decode_b64", one_head_wrong_scale, "one request-head scale x1.05"),
    *[
        (w, k, f"{label} ({w})")
        for w in ("decode", "paged_prefill", "ragged_prefill")
        for k, label in (
            (_wrong_scale(1.05), "scale x1.05"),
            (_lse_offset(0.15), "lse + 0.15"),
            (_lse_offset(0.01), "lse + 0.01"),
            (zero_output, "zero output"),
            (all_zeros, "all zeros"),
        )
    ],
    *[
        (w, _causal_shift(s), f"causal mask {s:+d} ({w})")
        for w in ("paged_prefill", "ragged_prefill")
        for s in (1, -1)
    ],
]


@pytest.mark.parametrize("workload, kernel", HONEST, ids=[f"{w}-{k.__name__}" for w, k in HONEST])
def test_honest_attention_passes(workload, kernel):
    d, x, ref = _case(workload)
    verdict = compare_outputs(d, ref, kernel(d, x, ref))
    assert verdict.status is EvaluationStatus.PASSED, verdict.reason
    assert verdict.correctness.rel_norm_error < 3e-3  # the bf16 bound (1e-2) is 3x this
    # Within one bf16 ulp of the largest |out| (inputs of several scales and kinds now:
    # outputs reach 4..8, where an ulp is 3.1e-2; once all below 4, where it is 1.6e-2).
    largest = float(ref["output"].float().abs().max())
    assert verdict.correctness.max_absolute_error <= 2.0 ** (math.floor(math.log2(largest)) - 7)


@pytest.mark.parametrize("workload, kernel, label", WRONG, ids=[w[2] for w in WRONG])
def test_wrong_attention_fails(workload, kernel, label):
    d, x, ref = _case(workload)
    verdict = compare_outputs(d, ref, kernel(d, x, ref))
    assert verdict.status is EvaluationStatus.INCORRECT_NUMERICAL, (label, verdict.correctness)


def test_attention_outputs_have_meaningful_size():
    """Values of mean 0.5: outputs are about 0.5, so zeros match no element (at 32k
    tokens zero-mean values gave outputs of 0.007, within bf16's atol of zero)."""
    d, x, ref = _case("decode_32k")
    assert float(x["v_cache"].float().mean()) == pytest.approx(ATTENTION_VALUE_MEAN, abs=0.01)
    assert abs(float(x["k_cache"].float().mean())) < 0.01  # keys stay zero-mean
    assert float(ref["output"].float().mean()) == pytest.approx(ATTENTION_VALUE_MEAN, abs=0.05)
    verdict = compare_outputs(d, ref, zero_output(d, x, ref))
    assert verdict.correctness.matched_ratio < 0.01


# -------------------------------------------------------------- rmsnorm and gemm: one row


# name, rows, honest bf16 kernel, wrong rows. One row of 2048 is 0.05% of the elements,
# inside the 0.1% that bf16's matched_ratio tolerates: the relative norm must catch it
# (zeros: 1/sqrt(2048) = 2.2e-2 > 1e-2). A row off by 10% in 2048 moves the norm by only
# 2.2e-3, within bounds; the GEMM case shows it caught in 16 rows.
ROW_CASES = [
    ("rmsnorm_h4096", 2048, entry_points.torch_rmsnorm, ("zeros", "100.0")),
    ("gemm_n1280_k8192", 16, entry_points.torch_gemm, ("zeros", "x1.1", "100.0")),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, rows, honest, wrong_rows", ROW_CASES, ids=[c[0] for c in ROW_CASES])
def test_one_wrong_row_fails_and_honest_bf16_passes(name, rows, honest, wrong_rows):
    d = DS.definition(name)
    (workload,) = [w.workload for w in DS.workloads_for(name) if rows in w.workload.axes.values()]
    x = synthesize_inputs(d, workload, seed=0, blob_root=DS)
    ref = _run(d, x)
    verdict = compare_outputs(d, ref, outputs_as_dict(d, honest(*[x[k] for k in d.inputs])))
    assert verdict.status is EvaluationStatus.PASSED, verdict.reason
    (out_name,) = d.outputs
    y = ref[out_name]
    assert y.shape[0] == rows
    for how in wrong_rows:
        wrong = y.clone()
        row = rows // 3
        if how == "zeros":
            wrong[row] = 0
        elif how == "x1.1":
            wrong[row] *= 1.1
        else:
            wrong[row] = 100.0
        verdict = compare_outputs(d, ref, {out_name: wrong})
        assert verdict.status is EvaluationStatus.INCORRECT_NUMERICAL, (how, verdict.correctness)
        if rows == 2048:
            assert verdict.correctness.matched_ratio >= 0.999  # the norm bound decided
