"""Shapes and checks shared by the position-encoding attention tests (RoPE, ALiBi)."""

from __future__ import annotations

import torch

HKV, GROUP, D = 2, 3, 64
HQ = HKV * GROUP
ATOL = RTOL = 3e-3


def offsets(lens: list[int]) -> torch.Tensor:
    """[0, lens[0], lens[0] + lens[1], ...] as int32: an indptr."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def ragged_qkv(qo_lens: list[int], kv_lens: list[int], device) -> tuple[torch.Tensor, ...]:
    """Fresh fp16 q [sum(qo_lens), HQ, D] and k, v [sum(kv_lens), HKV, D]: a ragged batch."""
    q = torch.randn(sum(qo_lens), HQ, D, dtype=torch.float16, device=device)
    k = torch.randn(sum(kv_lens), HKV, D, dtype=torch.float16, device=device)
    v = torch.randn(sum(kv_lens), HKV, D, dtype=torch.float16, device=device)
    return q, k, v


def compare(out, lse, ref_out, ref_lse) -> None:
    """Output within ATOL/RTOL; LSE -inf exactly where the reference's is, else close."""
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=ATOL, rtol=RTOL)
    finite = ~ref_lse.isinf().cpu()
    assert torch.equal(lse.isinf().cpu(), ~finite)
    torch.testing.assert_close(
        lse.float().cpu()[finite], ref_lse.float().cpu()[finite], atol=ATOL, rtol=RTOL
    )
