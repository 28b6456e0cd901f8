"""Host side of the sampling family: the kernels' runners and launches (kernels.py,
split_kernels.py), one TunableRunner per tunable kernel (its tactics from config.py), the
tuning inputs each needs, the fixed-tactic launches, and the public functions' (__init__.py)
validation, dispatch and CPU path (the sort-based references where no kernel runs).

The draw of a sampling launch is a function of its inputs, the seed tensor included, and
not of the tactic (see kernels.py): the tuner's inputs carry a fixed seed, so a
tactic passes the tuner's check that it reproduces the default tactic's samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton

from flashtune import env, platform
from flashtune.ops.call import FLOATS, KernelOp, check_tensor, field_index, inputs_of, named
from flashtune.ops.sampling import kernels, split_kernels
from flashtune.ops.sampling.config import PIVOTS, SamplingTactic, chunk_count, default_tactic
from flashtune.ops.sampling.reference import (
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
from flashtune.tune import (
    DEFAULT_TACTIC,
    DynamicDim,
    Tactic,
    TunableRunner,
    TuningConfig,
)

__all__ = [
    "SamplingArgs",
    "SamplingInputs",
    "RenormInputs",
    "SoftmaxInputs",
    "SamplingRunner",
    "RenormRunner",
    "SoftmaxRunner",
    "SAMPLING_RUNNERS",
    "RENORM_RUNNERS",
    "SOFTMAX_RUNNERS",
    "SAMPLING_TUNING",
    "RENORM_TUNING",
    "SOFTMAX_TUNING",
    "launch_sampling",
    "launch_split_rounds",
    "launch_logits_sampling",
    "launch_chain_speculative",
]


@dataclass(frozen=True)
class SamplingArgs:
    """The non-tensor part of a sampling launch: the kernel mode and scalar parameters."""

    mode: int
    top_k: int = 0
    top_p: float = 0.0


def _tactic(tactic: Tactic, vocab: int, batch: int, split: bool = False) -> SamplingTactic:
    # env.SAMPLING_SPLIT_DEFAULT=0 turns the split default off (one program a row).
    split = split and env.SAMPLING_SPLIT_DEFAULT.get()
    cfg = default_tactic(vocab, batch, split) if tactic == DEFAULT_TACTIC else tactic
    assert isinstance(cfg, SamplingTactic)
    return cfg


class SamplingInputs(NamedTuple):
    """SamplingRunner's inputs; the tuner keys on the fields before `generator`."""

    probs: torch.Tensor  # [rows, vocab], last dimension contiguous
    out: torch.Tensor  # [batch] int32 samples
    indices: torch.Tensor | None  # [batch]: the row of probs each output draws from
    seed: torch.Tensor  # [1] int64, drawn on the device from the generator
    top_k: torch.Tensor | None  # [batch] per-row top_k (else args.top_k)
    top_p: torch.Tensor | None  # [batch] per-row top_p / min_p (else args.top_p)
    args: SamplingArgs
    generator: torch.Generator | None = None  # the references' draws (no kernel: CPU)


class SamplingRunner(TunableRunner):
    """The rejection-sampling kernel, one program a row or a row over several (split
    tactics, small batches). inputs: SamplingInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[1].shape[0], split=True))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        a = named(SamplingInputs, inputs)
        batch, vocab = a.out.shape[0], a.probs.shape[1]
        cfg = _tactic(tactic, vocab, batch, True)
        launch_sampling(a.probs, a.out, a.indices, a.seed, a.top_k, a.top_p, a.args, cfg)
        return a.out


def launch_sampling(
    probs: torch.Tensor,
    out: torch.Tensor,
    indices: torch.Tensor | None,
    seed: torch.Tensor,
    k_arr: torch.Tensor | None,
    p_arr: torch.Tensor | None,
    args: SamplingArgs,
    cfg: SamplingTactic,
) -> torch.Tensor:
    """One draw per output row into out (int32) with tactic `cfg`. A split tactic runs
    `launch_split_rounds`, then sampling_kernel(RESUME) for the rows still undecided: a
    fixed sequence of launches (no host synchronization, graph-capturable)."""
    batch = out.shape[0]
    rows = min(cfg.rows, triton.next_power_of_2(batch))
    common, flags = _sampling_launch_args(probs, out, indices, seed, k_arr, p_arr, args, cfg)
    grid = (triton.cdiv(batch, rows),)
    if cfg.split <= 1:
        kernels.sampling_kernel[grid](*common, out, out, 0, 0, ROWS=rows, RESUME=False, **flags)
        return out
    work_f, work_i = launch_split_rounds(probs, out, indices, seed, k_arr, p_arr, args, cfg)
    if args.mode != kernels.MODE_PLAIN:  # plain sampling is done after the first pass
        workspace = (work_f, work_i, work_f.shape[1], work_i.shape[1])
        kernels.sampling_kernel[grid](*common, *workspace, ROWS=rows, RESUME=True, **flags)
    return out


def launch_split_rounds(
    probs: torch.Tensor,
    out: torch.Tensor,
    indices: torch.Tensor | None,
    seed: torch.Tensor,
    k_arr: torch.Tensor | None,
    p_arr: torch.Tensor | None,
    args: SamplingArgs,
    cfg: SamplingTactic,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split part of a split tactic: split_first_kernel, then `cfg.rounds`
    split_round_kernel launches, each row's passes shared by `cfg.split` programs. Writes the
    samples of the rows they decide into out; returns the workspace (float32, int32: the
    rows' state, column 0 of the int32 part their phase; O(batch x vocab / block))."""
    batch, vocab = out.shape[0], probs.shape[1]
    rows = min(cfg.rows, triton.next_power_of_2(batch))
    common, flags = _sampling_launch_args(probs, out, indices, seed, k_arr, p_arr, args, cfg)
    rounds = 0 if args.mode == kernels.MODE_PLAIN else cfg.rounds
    nchunk = chunk_count(vocab, cfg.block)
    ws_f, ws_i = split_kernels.split_workspace_widths(nchunk, PIVOTS, cfg.split, rounds + 1)
    work_f = torch.empty(batch, ws_f, dtype=torch.float32, device=probs.device)
    work_i = torch.zeros(batch, ws_i, dtype=torch.int32, device=probs.device)
    grid = (cfg.split, triton.cdiv(batch, rows))
    workspace = (work_f, work_i, ws_f, ws_i)
    split = {"SPLIT": cfg.split, "ROWS": rows}
    split_kernels.split_first_kernel[grid](*common, *workspace, **split, **flags)
    for launch in range(1, rounds + 1):
        split_kernels.split_round_kernel[grid](*common, *workspace, launch, **split, **flags)
    return work_f, work_i


def _sampling_launch_args(
    probs: torch.Tensor,
    out: torch.Tensor,
    indices: torch.Tensor | None,
    seed: torch.Tensor,
    k_arr: torch.Tensor | None,
    p_arr: torch.Tensor | None,
    args: SamplingArgs,
    cfg: SamplingTactic,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments every sampling kernel takes first, and the shared keyword flags."""
    batch, vocab = out.shape[0], probs.shape[1]
    common = (
        probs,
        out,
        indices if indices is not None else out,
        seed,
        k_arr if k_arr is not None else out,
        args.top_k,
        p_arr if p_arr is not None else probs,
        args.top_p,
        batch,
        vocab,
        probs.stride(0),
    )
    flags = {
        "MODE": args.mode,
        "HAS_INDICES": indices is not None,
        "K_ARRAY": k_arr is not None,
        "P_ARRAY": p_arr is not None,
        "PIVOTS": PIVOTS,
        "BLOCK": cfg.block,
        "NCHUNK": chunk_count(vocab, cfg.block),
        "PREFETCH": cfg.prefetch,
        "num_warps": cfg.num_warps,
    }
    return common, flags


def _sampling_tuning_inputs(inputs: Sequence[Any], profile: Any) -> list[Any]:
    """Valid random inputs at the profile's shapes: softmax rows, a fixed seed (so every
    tactic draws the same uniforms) and typical parameters."""
    probs, out, indices, _, k_arr, p_arr, args, *_ = inputs
    (rows, vocab), (batch,) = profile[0], profile[1]
    dev = probs.device
    new_probs = torch.softmax(torch.randn(rows, vocab, device=dev) * 3, dim=-1).to(probs.dtype)
    new_indices = None
    if indices is not None:
        new_indices = torch.randint(0, rows, (batch,), device=dev, dtype=indices.dtype)
    k = None if k_arr is None else torch.randint(1, 128, (batch,), device=dev).to(k_arr.dtype)
    p = None if p_arr is None else (0.5 + 0.5 * torch.rand(batch, device=dev)).to(p_arr.dtype)
    seed = torch.zeros(1, dtype=torch.int64, device=dev)
    out = torch.empty(batch, dtype=torch.int32, device=dev)
    return [new_probs, out, new_indices, seed, k, p, args]


SAMPLING_RUNNERS: tuple[TunableRunner, ...] = (SamplingRunner(),)
SAMPLING_TUNING = TuningConfig(
    dynamic_dims=tuple(
        DynamicDim(field_index(SamplingInputs, name), 0)
        for name in ("probs", "out", "indices", "top_k", "top_p")
    ),
    make_inputs=_sampling_tuning_inputs,
)


class RenormInputs(NamedTuple):
    """RenormRunner's inputs."""

    x: torch.Tensor  # [batch, vocab] probs (renorm) or logits (mask)
    out: torch.Tensor  # like x: float32 (renorm) or x's dtype (mask)
    top_k: torch.Tensor | None  # [batch] per-row top_k (else args.top_k)
    top_p: torch.Tensor | None  # [batch] per-row top_p (else args.top_p)
    args: SamplingArgs  # mode: a renorm_kernel mode


class RenormRunner(TunableRunner):
    """The exact-threshold renorm / mask kernel. inputs: RenormInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[0].shape[0]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, out, k_arr, p_arr, args = named(RenormInputs, inputs)
        batch, vocab = x.shape
        cfg = _tactic(tactic, vocab, batch)
        rows = min(cfg.rows, triton.next_power_of_2(batch))
        kernels.renorm_kernel[(triton.cdiv(batch, rows),)](
            x,
            out,
            k_arr if k_arr is not None else out,
            args.top_k,
            p_arr if p_arr is not None else out,
            args.top_p,
            batch,
            vocab,
            x.stride(0),
            out.stride(0),
            MODE=args.mode,
            K_ARRAY=k_arr is not None,
            P_ARRAY=p_arr is not None,
            PIVOTS=PIVOTS,
            ROWS=rows,
            BLOCK=cfg.block,
            NCHUNK=chunk_count(vocab, cfg.block),
            PREFETCH=cfg.prefetch,
            num_warps=cfg.num_warps,
        )
        return out


def _renorm_tuning_inputs(inputs: Sequence[Any], profile: Any) -> list[Any]:
    x, out, k_arr, p_arr, args = inputs
    (batch, vocab) = profile[0]
    dev = x.device
    if args.mode == kernels.MASK_TOP_K:
        new_x = torch.randn(batch, vocab, device=dev).to(x.dtype)
    else:
        new_x = torch.softmax(torch.randn(batch, vocab, device=dev) * 3, dim=-1).to(x.dtype)
    k = None if k_arr is None else torch.randint(1, 128, (batch,), device=dev).to(k_arr.dtype)
    p = None if p_arr is None else (0.5 + 0.5 * torch.rand(batch, device=dev)).to(p_arr.dtype)
    return [new_x, torch.empty(batch, vocab, dtype=out.dtype, device=dev), k, p, args]


RENORM_RUNNERS: tuple[TunableRunner, ...] = (RenormRunner(),)
RENORM_TUNING = TuningConfig(
    dynamic_dims=tuple(
        DynamicDim(field_index(RenormInputs, name), 0) for name in ("x", "out", "top_k", "top_p")
    ),
    make_inputs=_renorm_tuning_inputs,
)


class SoftmaxInputs(NamedTuple):
    """SoftmaxRunner's inputs."""

    logits: torch.Tensor  # [batch, vocab]
    out: torch.Tensor  # [batch, vocab] float32
    temperature: torch.Tensor | None  # [batch] per-row temperature (else temperature_value)
    temperature_value: float


class SoftmaxRunner(TunableRunner):
    """The online-softmax kernel. inputs: SoftmaxInputs."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[0].shape[0]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        logits, out, t_arr, t_val = named(SoftmaxInputs, inputs)
        batch, vocab = logits.shape
        cfg = _tactic(tactic, vocab, batch)
        rows = min(cfg.rows, triton.next_power_of_2(batch))
        kernels.softmax_kernel[(triton.cdiv(batch, rows),)](
            logits,
            out,
            t_arr if t_arr is not None else out,
            t_val,
            batch,
            vocab,
            logits.stride(0),
            out.stride(0),
            T_ARRAY=t_arr is not None,
            ROWS=rows,
            BLOCK=cfg.block,
            num_warps=cfg.num_warps,
        )
        return out


SOFTMAX_RUNNERS: tuple[TunableRunner, ...] = (SoftmaxRunner(),)
SOFTMAX_TUNING = TuningConfig(
    dynamic_dims=tuple(
        DynamicDim(field_index(SoftmaxInputs, name), 0) for name in ("logits", "out", "temperature")
    )
)


def launch_logits_sampling(
    logits: torch.Tensor, out: torch.Tensor, indices: torch.Tensor | None, seed: torch.Tensor
) -> torch.Tensor:
    """One draw per output row from softmax(logits) into out (int32), default tactic."""
    batch, vocab = out.shape[0], logits.shape[1]
    cfg = default_tactic(vocab, batch)
    rows = min(cfg.rows, triton.next_power_of_2(batch))
    kernels.logits_sampling_kernel[(triton.cdiv(batch, rows),)](
        logits,
        out,
        indices if indices is not None else out,
        seed,
        batch,
        vocab,
        logits.stride(0),
        HAS_INDICES=indices is not None,
        ROWS=rows,
        BLOCK=cfg.block,
        NCHUNK=chunk_count(vocab, cfg.block),
        num_warps=cfg.num_warps,
    )
    return out


def launch_chain_speculative(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    out: torch.Tensor,
    accepted: torch.Tensor,
    emitted: torch.Tensor,
    seed: torch.Tensor,
) -> torch.Tensor:
    """Chain speculative sampling into out [batch, n + 1] (int32); the counts are added
    into accepted and emitted. One program a request; its draws read the vocabulary once."""
    batch, n, vocab = draft_probs.shape
    cfg = default_tactic(vocab, 1)
    block = min(cfg.block, 1024)
    kernels.chain_speculative_kernel[(batch,)](
        draft_probs.contiguous(),
        draft_token_ids.contiguous(),
        target_probs.contiguous(),
        out,
        accepted,
        emitted,
        seed,
        n,
        vocab,
        BLOCK=block,
        NCHUNK=chunk_count(vocab, block),
        num_warps=cfg.num_warps,
    )
    return out


# ----------------------------------------------------------------------------------------------
# The public functions' host side (__init__.py): validation, dispatch, the CPU path
# ----------------------------------------------------------------------------------------------


def _check_rows(name: str, x: Any) -> None:
    check_tensor(name, x)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, vocab], got shape {tuple(x.shape)}")
    check_tensor(name, x, FLOATS, contiguous=True)
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column, got shape {tuple(x.shape)}")


def _check_indices(indices: Any, device: torch.device) -> None:
    if indices is None:
        return
    check_tensor("indices", indices)
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
    args = SamplingArgs(mode, k_val, p_val)
    inputs = (probs, out, indices, seed, k_arr, p_arr, args, generator)
    return _SAMPLING(inputs_of(SamplingInputs, inputs), f"flashtune::sampling_{mode}")


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


def _sample_reference(a: SamplingInputs) -> torch.Tensor:
    """The sort-based references, where no Triton kernel can run."""
    rows = a.probs if a.indices is None else a.probs[a.indices.long()]
    batch = rows.shape[0]
    k = a.top_k if a.top_k is not None else torch.full((batch,), a.args.top_k, device=rows.device)
    p = a.top_p if a.top_p is not None else torch.full((batch,), a.args.top_p, device=rows.device)
    return _REFERENCES[a.args.mode](rows, k, p, a.generator).to(torch.int32)


_SAMPLING = KernelOp(
    "flashtune::sampling", SAMPLING_RUNNERS, SAMPLING_TUNING, _sample_reference, tuned=7
)


def _renorm_reference(a: RenormInputs) -> torch.Tensor:
    """The references, where no Triton kernel can run (their result, not out)."""
    batch = a.x.shape[0]
    k = a.top_k if a.top_k is not None else torch.full((batch,), a.args.top_k, device=a.x.device)
    p = a.top_p if a.top_p is not None else torch.full((batch,), a.args.top_p, device=a.x.device)
    if a.args.mode == kernels.RENORM_TOP_P:
        return top_p_renorm_probs_ref(a.x, p)
    if a.args.mode == kernels.RENORM_TOP_K:
        return top_k_renorm_probs_ref(a.x, k)
    return top_k_mask_logits_ref(a.x, k)


_RENORM = KernelOp("flashtune::renorm", RENORM_RUNNERS, RENORM_TUNING, _renorm_reference)


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
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    inputs = inputs_of(RenormInputs, (x, out, k_arr, p_arr, SamplingArgs(mode, k_val, p_val)))
    if batch == 0 and _RENORM.kernels_available(x.device):
        return out
    return _RENORM(inputs, f"flashtune::renorm_{mode}")


def _softmax_reference(a: SoftmaxInputs) -> torch.Tensor:
    """The reference, where no Triton kernel can run (its result, not out)."""
    batch = a.logits.shape[0]
    t = a.temperature
    return softmax_ref(
        a.logits,
        t if t is not None else torch.full((batch,), a.temperature_value, device=a.logits.device),
    )


_SOFTMAX = KernelOp("flashtune::softmax", SOFTMAX_RUNNERS, SOFTMAX_TUNING, _softmax_reference)


def _softmax(logits: torch.Tensor, temperature: Any) -> torch.Tensor:
    _check_rows("logits", logits)
    batch = logits.shape[0]
    t_val = 1.0 if temperature is None else temperature
    t_arr, t_val = _per_row("temperature", t_val, batch, logits.device, False)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if batch == 0 and _SOFTMAX.kernels_available(logits.device):
        return out
    return _SOFTMAX(inputs_of(SoftmaxInputs, (logits, out, t_arr, t_val)))


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
