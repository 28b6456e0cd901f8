"""Sampling: FlashInfer's sorting-free sampling family (flashinfer.sampling, 0.2.14 API).

softmax (with temperature), sampling_from_probs / _logits, top_p / top_k / min_p sampling,
top_k_top_p sampling from probs or logits ("top_k_first" or "joint"), top_p / top_k
renormalization, top_k logits masking and chain speculative sampling. Per-row parameters
are tensors of shape (batch,) or Python scalars; `indices` maps each output row to a row of
probs/logits; `generator` seeds the draws; `deterministic` is accepted for compatibility
(every kernel here is deterministic); `check_nan` raises on NaN input (a host
synchronization, only when asked).

Beside this module: the kernels (sampling_kernels.py), their runners and launches
(sampling_run.py), tactics (sampling_config.py), references and schemas
(sampling_schema.py). The kernels need no sort and no temporary the size of the input: one
pass over a row per rejection round. A call draws its random seed on the device from the
generator (no host synchronization), so calls are CUDA-graph capturable and a replayed graph
draws anew. Without Triton (CPU without the interpreter) the sort-based references run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from flashtune import platform
from flashtune.flashinfer_names import TOP_LEVEL
from flashtune.model_shapes import ModelConfig
from flashtune.ops import sampling_kernels as kernels
from flashtune.ops.sampling_config import SamplingTactic
from flashtune.ops.sampling_run import (
    RENORM_RUNNERS,
    RENORM_TUNING,
    SAMPLING_RUNNERS,
    SAMPLING_TUNING,
    SOFTMAX_RUNNERS,
    SOFTMAX_TUNING,
    RenormRunner,
    SamplingArgs,
    SamplingRunner,
    SoftmaxRunner,
    launch_chain_speculative,
    launch_logits_sampling,
)
from flashtune.ops.sampling_schema import (
    MIN_P_SAMPLING,
    SAMPLING_FROM_LOGITS,
    SAMPLING_FROM_PROBS,
    SOFTMAX,
    TOP_K_MASK_LOGITS,
    TOP_K_RENORM,
    TOP_K_SAMPLING,
    TOP_K_TOP_P_JOINT_SAMPLING,
    TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS,
    TOP_K_TOP_P_SAMPLING,
    TOP_K_TOP_P_SAMPLING_FROM_LOGITS,
    TOP_P_RENORM,
    TOP_P_SAMPLING,
    chain_speculative_sampling_ref,
    min_p_sampling_from_probs_ref,
    sampling_from_logits_ref,
    sampling_from_probs_ref,
    softmax_ref,
    top_k_mask_logits_ref,
    top_k_renorm_probs_ref,
    top_k_sampling_from_probs_ref,
    top_k_top_p_joint_sampling_from_probs_ref,
    top_k_top_p_sampling_from_probs_ref,
    top_p_renorm_probs_ref,
    top_p_sampling_from_probs_ref,
)
from flashtune.schema import REGISTRY, ApiOp, OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples
from flashtune.tune import (
    choose_one,
)

__all__ = [
    *TOP_LEVEL["sampling"],  # FlashInfer's names (flashtune.flashinfer_names)
    "SamplingArgs",
    "SamplingOp",
    "SamplingTactic",
    "SamplingRunner",
    "RenormRunner",
    "SoftmaxRunner",
    "SAMPLING_TUNING",
    "RENORM_TUNING",
    "sampling_examples",
    "MIN_P_SAMPLING",
    "SAMPLING_FROM_LOGITS",
    "SAMPLING_FROM_PROBS",
    "SOFTMAX",
    "TOP_K_MASK_LOGITS",
    "TOP_K_RENORM",
    "TOP_K_SAMPLING",
    "TOP_K_TOP_P_JOINT_SAMPLING",
    "TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS",
    "TOP_K_TOP_P_SAMPLING",
    "TOP_K_TOP_P_SAMPLING_FROM_LOGITS",
    "TOP_P_RENORM",
    "TOP_P_SAMPLING",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------
# The schema's view of a call
# ----------------------------------------------------------------------------------------------

# Per-row parameters as the Definitions hold them: (batch,) tensors of these dtypes.
_PER_ROW = {
    "top_k": torch.int32,
    "top_p": torch.float32,
    "min_p": torch.float32,
    "temperature": torch.float32,
}


class SamplingOp(ApiOp):
    """`@api` for the sampling family: the schema sees scalar parameters as (batch,) tensors
    of the Definition's dtype (so a call with top_p=0.9 has the corpus's Definition) and
    refuses the calls no Definition describes: `indices` (outputs and probability rows
    differ in number), a `generator` (the draws depend on its state, which a Definition
    cannot carry) and `check_nan` (a check the Definition's solutions would skip). Such
    calls are neither captured nor applied; they run flashtune's own kernels."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        for option in ("indices", "generator"):
            if arguments.get(option) is not None:
                raise ValueError(f"{self.fn.__name__}: a call with {option}= has no Definition")
        if arguments.get("check_nan"):
            raise ValueError(f"{self.fn.__name__}: a call with check_nan=True has no Definition")
        rows = arguments.get("probs", arguments.get("logits"))
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
            return arguments  # the schema reports it
        for name, dtype in _PER_ROW.items():
            if name not in arguments:
                continue
            value = 1.0 if arguments[name] is None else arguments[name]
            if isinstance(value, torch.Tensor):
                arguments[name] = value.to(dtype)
            else:
                arguments[name] = torch.full(
                    (rows.shape[0],), value, dtype=dtype, device=rows.device
                )
        return arguments


def sampling_api(
    schema: OpSchema | Callable[..., OpSchema], schemas: Sequence[OpSchema] | None = None
) -> Callable[[Callable[..., Any]], SamplingOp]:
    """Register `fn` as a schema'd sampling op (schema: an OpSchema, or a callable choosing
    one of `schemas` from the arguments)."""

    def wrap(fn: Callable[..., Any]) -> SamplingOp:
        op = SamplingOp(fn, schema, None if schemas is None else list(schemas))
        REGISTRY[op.qualname] = op
        return op

    return wrap


def _by_order(joint: OpSchema, top_k_first: OpSchema) -> Callable[..., OpSchema]:
    def select(*args: Any, filter_apply_order: str = "top_k_first", **kwargs: Any) -> OpSchema:
        if filter_apply_order == "joint":
            return joint
        if filter_apply_order == "top_k_first":
            return top_k_first
        raise ValueError(
            f"filter_apply_order must be 'top_k_first' or 'joint', got {filter_apply_order!r}"
        )

    return select


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _check_rows(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, vocab], got shape {tuple(x.shape)}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column, got shape {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {x.stride()}"
        )


def _check_indices(indices: Any, device: torch.device) -> None:
    if indices is None:
        return
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor or None, got {type(indices).__name__}")
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"indices must be a 1-D int32/int64 tensor, got {indices.dtype} of shape {tuple(indices.shape)}"
        )
    if indices.device != device:
        raise ValueError(f"indices is on {indices.device} but the rows are on {device}")


def _per_row(
    name: str, value: Any, batch: int, device: torch.device, integer: bool
) -> tuple[Any, Any]:
    """(the (batch,) tensor or None, the scalar or 0) of a per-row parameter. A tensor of
    any real dtype is read as the kernel's (int32 top_k, fp32 top_p), as FlashInfer casts it
    (its tests pass torch.full((batch,), 1) as min_p)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != batch:
            raise ValueError(
                f"{name} must have shape ({batch},) (one per row), got {tuple(value.shape)}"
            )
        if value.dtype == torch.bool or value.dtype.is_complex:
            raise TypeError(f"{name} must be a real-valued tensor, got {value.dtype}")
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but the rows are on {device}")
        return value.contiguous(), 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a tensor or a number, got {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return None, int(value) if integer else float(value)


def _check_generator(generator: Any, device: torch.device) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if torch.device(generator.device).type != device.type:
        raise ValueError(f"generator is on {generator.device} but the rows are on {device}")


def _check_nan(name: str, x: torch.Tensor) -> None:
    if bool(torch.isnan(x).any()):
        raise ValueError(f"Input {name} contains NaN.")


def _seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """This call's seed, drawn on the device: no host synchronization, replayed by graphs."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device, generator=generator)


def _sample(
    probs: torch.Tensor,
    mode: int,
    indices: torch.Tensor | None,
    generator: torch.Generator | None,
    check_nan: bool,
    top_k: Any = None,
    top_p: Any = None,
) -> torch.Tensor:
    """Validate, then draw one token per output row with the kernel of `mode` (top_p holds
    min_p for MODE_MIN_P)."""
    _check_rows("probs", probs)
    _check_indices(indices, probs.device)
    _check_generator(generator, probs.device)
    batch = indices.shape[0] if indices is not None else probs.shape[0]
    k_arr, k_val = (None, 0)
    p_arr, p_val = (None, 0.0)
    if top_k is not None:
        k_arr, k_val = _per_row("top_k", top_k, batch, probs.device, integer=True)
    if top_p is not None:
        p_name = "min_p" if mode == kernels.MODE_MIN_P else "top_p"
        p_arr, p_val = _per_row(p_name, top_p, batch, probs.device, integer=False)
    if check_nan:
        _check_nan("probs", probs)
    out = torch.empty(batch, dtype=torch.int32, device=probs.device)
    if batch == 0:
        return out
    seed = _seed(generator, probs.device)
    if not platform.kernels_available(probs.device):
        return _sample_without_kernels(probs, mode, indices, generator, k_arr, k_val, p_arr, p_val)
    inputs = [probs, out, indices, seed, k_arr, p_arr, SamplingArgs(mode, k_val, p_val)]
    runner, tactic = choose_one(
        f"flashtune::sampling_{mode}", SAMPLING_RUNNERS, SAMPLING_TUNING, inputs
    )
    return runner.forward(inputs, tactic)


_REFERENCES: dict[int, Callable[..., torch.Tensor]] = {
    kernels.MODE_PLAIN: lambda p, k, q, g: sampling_from_probs_ref(p, generator=g),
    kernels.MODE_TOP_P: lambda p, k, q, g: top_p_sampling_from_probs_ref(p, q, generator=g),
    kernels.MODE_TOP_K: lambda p, k, q, g: top_k_sampling_from_probs_ref(p, k, generator=g),
    kernels.MODE_MIN_P: lambda p, k, q, g: min_p_sampling_from_probs_ref(p, q, generator=g),
    kernels.MODE_JOINT: lambda p, k, q, g: top_k_top_p_joint_sampling_from_probs_ref(
        p, k, q, generator=g
    ),
    kernels.MODE_TOP_K_FIRST: lambda p, k, q, g: top_k_top_p_sampling_from_probs_ref(
        p, k, q, generator=g
    ),
}


def _sample_without_kernels(
    probs: torch.Tensor,
    mode: int,
    indices: torch.Tensor | None,
    generator: torch.Generator | None,
    k_arr: torch.Tensor | None,
    k_val: int,
    p_arr: torch.Tensor | None,
    p_val: float,
) -> torch.Tensor:
    """The sort-based references, where no Triton kernel can run."""
    rows = probs if indices is None else probs[indices.long()]
    batch = rows.shape[0]
    k = k_arr if k_arr is not None else torch.full((batch,), k_val, device=rows.device)
    p = p_arr if p_arr is not None else torch.full((batch,), p_val, device=rows.device)
    return _REFERENCES[mode](rows, k, p, generator).to(torch.int32)


def _renorm(
    x: torch.Tensor, name: str, mode: int, top_k: Any = None, top_p: Any = None
) -> torch.Tensor:
    _check_rows(name, x)
    batch = x.shape[0]
    k_arr, k_val = (
        _per_row("top_k", top_k, batch, x.device, True) if top_k is not None else (None, 0)
    )
    p_arr, p_val = (
        _per_row("top_p", top_p, batch, x.device, False) if top_p is not None else (None, 0.0)
    )
    dtype = x.dtype if mode == kernels.MASK_TOP_K else torch.float32
    if not platform.kernels_available(x.device):
        k = k_arr if k_arr is not None else torch.full((batch,), k_val, device=x.device)
        p = p_arr if p_arr is not None else torch.full((batch,), p_val, device=x.device)
        if mode == kernels.RENORM_TOP_P:
            return top_p_renorm_probs_ref(x, p)
        if mode == kernels.RENORM_TOP_K:
            return top_k_renorm_probs_ref(x, k)
        return top_k_mask_logits_ref(x, k)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    if batch == 0:
        return out
    inputs = [x, out, k_arr, p_arr, SamplingArgs(mode, k_val, p_val)]
    runner, tactic = choose_one(f"flashtune::renorm_{mode}", RENORM_RUNNERS, RENORM_TUNING, inputs)
    return runner.forward(inputs, tactic)


def _sample_logits(
    logits: torch.Tensor, indices: Any, generator: Any, check_nan: bool
) -> torch.Tensor:
    _check_rows("logits", logits)
    _check_indices(indices, logits.device)
    _check_generator(generator, logits.device)
    if check_nan:
        _check_nan("logits", logits)
    batch = indices.shape[0] if indices is not None else logits.shape[0]
    out = torch.empty(batch, dtype=torch.int32, device=logits.device)
    if batch == 0:
        return out
    seed = _seed(generator, logits.device)
    if not platform.kernels_available(logits.device):
        rows = logits if indices is None else logits[indices.long()]
        return sampling_from_logits_ref(rows, generator=generator).to(torch.int32)
    return launch_logits_sampling(logits, out, indices, seed)


def _order(filter_apply_order: Any) -> int:
    if filter_apply_order == "top_k_first":
        return kernels.MODE_TOP_K_FIRST
    if filter_apply_order == "joint":
        return kernels.MODE_JOINT
    raise ValueError(
        f"Invalid filter_apply_order: {filter_apply_order!r} (expected 'top_k_first' or 'joint')"
    )


# ----------------------------------------------------------------------------------------------
# Public API (FlashInfer 0.2.14's names and signatures)
# ----------------------------------------------------------------------------------------------


@sampling_api(schema=SOFTMAX)
def softmax(
    logits: torch.Tensor,
    temperature: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """softmax(logits / temperature) per row, in fp32. temperature: None (1.0), a float, or
    a (batch,) tensor. enable_pdl is accepted for compatibility."""
    _check_rows("logits", logits)
    t_arr, t_val = _per_row(
        "temperature",
        1.0 if temperature is None else temperature,
        logits.shape[0],
        logits.device,
        False,
    )
    if not platform.kernels_available(logits.device):
        t = (
            t_arr
            if t_arr is not None
            else torch.full((logits.shape[0],), t_val, device=logits.device)
        )
        return softmax_ref(logits, t)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if logits.shape[0] == 0:
        return out
    inputs = [logits, out, t_arr, t_val]
    runner, tactic = choose_one("flashtune::softmax", SOFTMAX_RUNNERS, SOFTMAX_TUNING, inputs)
    return runner.forward(inputs, tactic)


@sampling_api(schema=SAMPLING_FROM_PROBS)
def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """One draw per output row from probs [rows, vocab] (row indices[i] for output i when
    given). Returns int32 samples of shape (batch,)."""
    return _sample(probs, kernels.MODE_PLAIN, indices, generator, check_nan)


@sampling_api(schema=SAMPLING_FROM_LOGITS)
def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """One draw per output row from softmax(logits), in one pass (no probabilities written)."""
    return _sample_logits(logits, indices, generator, check_nan)


@sampling_api(schema=TOP_P_SAMPLING)
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-p (nucleus) sampling: one draw per row from the most likely tokens whose mass
    reaches top_p (a float or a (batch,) tensor)."""
    return _sample(probs, kernels.MODE_TOP_P, indices, generator, check_nan, top_p=top_p)


@sampling_api(schema=TOP_K_SAMPLING)
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k sampling: one draw per row from its k most likely tokens (ties kept)."""
    return _sample(probs, kernels.MODE_TOP_K, indices, generator, check_nan, top_k=top_k)


@sampling_api(schema=MIN_P_SAMPLING)
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Min-p sampling: one draw per row from the tokens >= min_p * its largest probability."""
    return _sample(probs, kernels.MODE_MIN_P, indices, generator, check_nan, top_p=min_p)


@sampling_api(
    schema=_by_order(TOP_K_TOP_P_JOINT_SAMPLING, TOP_K_TOP_P_SAMPLING),
    schemas=[TOP_K_TOP_P_SAMPLING, TOP_K_TOP_P_JOINT_SAMPLING],
)
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k and top-p sampling. "top_k_first": top-p on the renormalized top-k tokens;
    "joint": the tokens both filters keep on the original row."""
    mode = _order(filter_apply_order)
    return _sample(probs, mode, indices, generator, check_nan, top_k=top_k, top_p=top_p)


@sampling_api(
    schema=_by_order(TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS, TOP_K_TOP_P_SAMPLING_FROM_LOGITS),
    schemas=[TOP_K_TOP_P_SAMPLING_FROM_LOGITS, TOP_K_TOP_P_JOINT_SAMPLING_FROM_LOGITS],
)
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
) -> torch.Tensor:
    """Top-k and top-p sampling from logits: softmax (torch's, so a call draws exactly what
    the same call on torch.softmax(logits) draws), then top_k_top_p_sampling_from_probs."""
    mode = _order(filter_apply_order)
    _check_rows("logits", logits)
    if check_nan:
        _check_nan("logits", logits)
    probs = torch.softmax(logits.float(), dim=-1)
    return _sample(probs, mode, indices, generator, False, top_k=top_k, top_p=top_p)


@sampling_api(schema=TOP_P_RENORM)
def top_p_renorm_probs(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """probs with the tokens top-p sampling would not draw zeroed, renormalized (fp32)."""
    return _renorm(probs, "probs", kernels.RENORM_TOP_P, top_p=top_p)


@sampling_api(schema=TOP_K_RENORM)
def top_k_renorm_probs(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """probs with all but the k largest (ties kept) zeroed, renormalized (fp32)."""
    return _renorm(probs, "probs", kernels.RENORM_TOP_K, top_k=top_k)


@sampling_api(schema=TOP_K_MASK_LOGITS)
def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """logits with all but the k largest (ties kept) set to -inf, in logits' dtype."""
    return _renorm(logits, "logits", kernels.MASK_TOP_K, top_k=top_k)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain of draft tokens (see chain_speculative_sampling_ref).

    draft_probs [batch, n, vocab], draft_token_ids [batch, n], target_probs
    [batch, n + 1, vocab]. Returns (output_token_ids [batch, n + 1] int32, rejected positions
    -1; accepted [batch]; emitted [batch]); the two counts are added into the given tensors.
    Not schema'd: no Definition describes it yet (its counts accumulate in place)."""
    for name, x in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.dtype not in _FLOATS:
            raise ValueError(
                f"{name} must be a 3-D float tensor [batch, tokens, vocab], got {x!r:.80}"
            )
    batch, n, vocab = draft_probs.shape
    if n < 1 or tuple(target_probs.shape) != (batch, n + 1, vocab):
        raise ValueError(
            f"target_probs must have shape {(batch, n + 1, vocab)} for draft_probs of shape "
            f"{tuple(draft_probs.shape)} (n >= 1), got {tuple(target_probs.shape)}"
        )
    if not isinstance(draft_token_ids, torch.Tensor) or tuple(draft_token_ids.shape) != (batch, n):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, n)}, got {getattr(draft_token_ids, 'shape', draft_token_ids)!r}"
        )
    dev = draft_probs.device
    counts = []
    for name, given in (
        ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num),
    ):
        if given is None:
            given = torch.zeros(batch, dtype=torch.int32, device=dev)
        elif given.shape != (batch,) or given.dtype != torch.int32:
            raise ValueError(
                f"{name} must be an int32 tensor of shape ({batch},), got {given.dtype} {tuple(given.shape)}"
            )
        counts.append(given)
    _check_generator(generator, dev)
    seed = _seed(generator, dev)
    if not platform.kernels_available(dev):
        out, acc, emi = chain_speculative_sampling_ref(
            draft_probs, draft_token_ids, target_probs, generator
        )
        counts[0] += acc
        counts[1] += emi
        return out, counts[0], counts[1]
    out = torch.empty(batch, n + 1, dtype=torch.int32, device=dev)
    launch_chain_speculative(
        draft_probs, draft_token_ids, target_probs, out, counts[0], counts[1], seed
    )
    return out, counts[0], counts[1]


@register_examples
def sampling_examples(model: ModelConfig) -> list[Example]:
    """Each op on one row of the model's vocabulary (fp32, as the corpus's definitions)."""
    probs = meta_tensor(1, model.vocab_size, dtype=torch.float32)
    logits = meta_tensor(1, model.vocab_size, dtype=torch.float32)
    joint = {"filter_apply_order": "joint"}
    return [
        (softmax, (logits,), {"temperature": 1.0}),
        (sampling_from_probs, (probs,), {}),
        (sampling_from_logits, (logits,), {}),
        (top_p_sampling_from_probs, (probs, 0.9), {}),
        (top_k_sampling_from_probs, (probs, 50), {}),
        (min_p_sampling_from_probs, (probs, 0.1), {}),
        (top_k_top_p_sampling_from_probs, (probs, 50, 0.9), {}),
        (top_k_top_p_sampling_from_probs, (probs, 50, 0.9), joint),
        (top_k_top_p_sampling_from_logits, (logits, 50, 0.9), {}),
        (top_k_top_p_sampling_from_logits, (logits, 50, 0.9), joint),
        (top_p_renorm_probs, (probs, 0.9), {}),
        (top_k_renorm_probs, (probs, 50), {}),
        (top_k_mask_logits, (logits, 50), {}),
    ]
