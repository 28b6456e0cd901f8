"""The bundled dataset's sampling ops: top-k, top-p and top-k-then-top-p from probabilities,
at Llama-3's vocabulary (the corpus's first size; one row costs the CPU run's sort-based
baseline the most of any op).

The sampling Definitions' samples are int64 (the FlashInfer-Trace corpus's); flashtune and
FlashInfer return int32, so every adapter casts (one small kernel, paid by all alike).
top_k_top_p is FlashInfer's default order, "top_k_first", as the Definition's reference.
"""

from __future__ import annotations

import torch

from flashtune.data import Definition, Workload
from flashtune.ops.bundle import (
    NO_SETUP,
    BundledOp,
    Entry,
    WorkloadContext,
    flashinfer_direct,
    runs_the_op,
    tuned_api,
)
from flashtune.ops.bundle.workloads import stable_uuid

BATCH = [1, 4, 16, 64, 256]  # rows sampled a step (the decode batch)
CONSTS = {"vocab_size": 128256}
_INT64 = ", sorting-free, samples cast to the Definition's int64"
_SORTED = "the op's reference in ops.sampling.reference: sort, cumulative sum, inverse CDF. "


@runs_the_op
def flashtune_top_k_sampling(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.sampling import top_k_sampling_from_probs

    return top_k_sampling_from_probs(probs, top_k).long()


@runs_the_op
def flashtune_top_p_sampling(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.sampling import top_p_sampling_from_probs

    return top_p_sampling_from_probs(probs, top_p).long()


@runs_the_op
def flashtune_top_k_top_p_sampling(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    from flashtune.ops.sampling import top_k_top_p_sampling_from_probs

    return top_k_top_p_sampling_from_probs(probs, top_k, top_p).long()


def flashinfer_top_k_sampling(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.sampling.top_k_sampling_from_probs(probs, top_k).long()


def flashinfer_top_p_sampling(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.sampling.top_p_sampling_from_probs(probs, top_p).long()


def flashinfer_top_k_top_p_sampling(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    import flashinfer

    return flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, top_k, top_p).long()


def torch_top_k_sampling(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.sampling.reference import top_k_sampling_from_probs_ref

    return top_k_sampling_from_probs_ref(probs, top_k)


def torch_top_p_sampling(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    from flashtune.ops.sampling.reference import top_p_sampling_from_probs_ref

    return top_p_sampling_from_probs_ref(probs, top_p)


def torch_top_k_top_p_sampling(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    from flashtune.ops.sampling.reference import top_k_top_p_sampling_from_probs_ref

    return top_k_top_p_sampling_from_probs_ref(probs, top_k, top_p)


def _workloads(definition: Definition, ctx: WorkloadContext) -> list[Workload]:
    return [
        Workload(uuid=stable_uuid(definition.name, n), axes={"batch_size": n}, inputs={})
        for n in BATCH
    ]


def _op(prefix: str, flashtune, torch_baseline, flashinfer_entry, torch_how, fi_note) -> BundledOp:
    return BundledOp(
        prefix=prefix,
        workloads=_workloads,
        consts=CONSTS,
        entries=(
            Entry("flashtune", flashtune, tuned_api(f"ops.sampling.{prefix}", _INT64)),
            Entry("torch", torch_baseline, f"PyTorch eager baseline, {torch_how}{NO_SETUP}"),
            Entry(
                "flashinfer",
                flashinfer_entry,
                flashinfer_direct(f"flashinfer.sampling.{prefix} {fi_note}"),
            ),
        ),
    )


BUNDLED = (
    _op(
        "top_k_sampling_from_probs",
        flashtune_top_k_sampling,
        torch_top_k_sampling,
        flashinfer_top_k_sampling,
        "sort-based (torch.topk, inverse CDF). ",
        "(samples cast to int64)",
    ),
    _op(
        "top_p_sampling_from_probs",
        flashtune_top_p_sampling,
        torch_top_p_sampling,
        flashinfer_top_p_sampling,
        _SORTED,
        "(samples cast to int64)",
    ),
    _op(
        "top_k_top_p_sampling_from_probs",
        flashtune_top_k_top_p_sampling,
        torch_top_k_top_p_sampling,
        flashinfer_top_k_top_p_sampling,
        _SORTED,
        "(its default order, top_k_first; samples cast to int64)",
    ),
)
