"""Runners and launches of the sampling kernels (sampling_kernels.py) for the public
functions in sampling.py: one TunableRunner per tunable kernel (its tactics from
sampling_config.py), the tuning inputs each needs, and the fixed-tactic launches.

The draw of a sampling launch is a function of its inputs, the seed tensor included, and
not of the tactic (see sampling_kernels.py): the tuner's inputs carry a fixed seed, so a
tactic passes the tuner's check that it reproduces the default tactic's samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from flashtune import env
from flashtune.ops import sampling_kernels as kernels
from flashtune.ops import sampling_split_kernels as split_kernels
from flashtune.ops.sampling_config import PIVOTS, SamplingTactic, chunk_count, default_tactic
from flashtune.tune import DEFAULT_TACTIC, DynamicDim, Tactic, TunableRunner, TuningConfig

__all__ = [
    "SamplingArgs",
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


class SamplingRunner(TunableRunner):
    """The rejection-sampling kernel, one program a row or a row over several (split
    tactics, small batches). inputs: [probs, out, indices | None, seed, top_k (batch,) |
    None, top_p (batch,) | None, SamplingArgs]."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[1].shape[0], split=True))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        probs, out, indices, seed, k_arr, p_arr, args = inputs
        batch, vocab = out.shape[0], probs.shape[1]
        launch_sampling(
            probs, out, indices, seed, k_arr, p_arr, args, _tactic(tactic, vocab, batch, True)
        )
        return out


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
    probs, out, indices, _, k_arr, p_arr, args = inputs
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
    dynamic_dims=tuple(DynamicDim(i, 0) for i in (0, 1, 2, 4, 5)),
    make_inputs=_sampling_tuning_inputs,
)


class RenormRunner(TunableRunner):
    """The exact-threshold renorm / mask kernel. inputs: [x, out, top_k | None,
    top_p | None, SamplingArgs] (mode: a renorm_kernel mode)."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[0].shape[0]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        x, out, k_arr, p_arr, args = inputs
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
    dynamic_dims=tuple(DynamicDim(i, 0) for i in (0, 1, 2, 3)),
    make_inputs=_renorm_tuning_inputs,
)


class SoftmaxRunner(TunableRunner):
    """The online-softmax kernel. inputs: [logits, out, temperature | None, float]."""

    def get_valid_tactics(self, inputs: Sequence[Any], profile: Any) -> list[Tactic]:
        return list(SamplingTactic.space(inputs[0].shape[1], inputs[0].shape[0]))

    def forward(self, inputs: Sequence[Any], tactic: Tactic = DEFAULT_TACTIC) -> Any:
        logits, out, t_arr, t_val = inputs
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
SOFTMAX_TUNING = TuningConfig(dynamic_dims=(DynamicDim(0, 0), DynamicDim(1, 0), DynamicDim(2, 0)))


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
