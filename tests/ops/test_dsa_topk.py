"""The indexer's radix select (ops/dsa/topk.py) against torch.topk: the same multiset of
chosen scores per row (so the same set where scores are distinct), distinct positions all
below seq_len, -1 after the min(topk, seq_len) chosen, slots mapped through the block
table, ties at the k-th score to the lowest positions. Rows: random scores (negative ones
too), heavy ties, one value everywhere, scores crowded into one 12-bit bin, shorter than
topk, empty, seq_len past the width, and scores past seq_len that would win if read.

Interpreter tests run float32 scores on the CPU (long rows with big tiles, so few
programs); the `cuda` test runs DeepSeek-V3.2's sizes inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops.dsa.launch import select_topk
from flashtune.ops.dsa.topk import SelectTactic, radix_topk_slots

PAGE_SIZE = 16


def _scores(kind: int, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == 0:  # continuous, about half negative
        return torch.randn(n, generator=gen) * 3
    if kind == 1:  # a few values: ties everywhere, the k-th score shared by many
        return torch.randint(-2, 3, (n,), generator=gen).float()
    if kind == 2:  # one value: every position ties
        return torch.full((n,), -0.5)
    # Positives crowded into one 12-bit bin (the candidates are most of the row).
    return 1.0 + torch.rand(n, generator=gen) * 1e-3


_KINDS = (0, 1, 0, 0, 3, 1, 2, 3)  # per row: crowded rows at topk + 1, ties at length - 1


def _case(batch: int, length: int, topk: int, seed: int = 0):
    """Scores [batch, length] (past seq_len -inf, as the indexer writes them, except in one
    row where they are +inf: never read), seq_lens, and a shuffled block table."""
    gen = torch.Generator().manual_seed(seed * 1000 + batch * 7 + length + topk)
    pattern = [length, max(length // 3, 1), 0, min(topk - 1, length), min(topk + 1, length),
               length + 5, max(length - 1, 0), min(topk, length)]  # fmt: skip
    lens = [pattern[b % len(pattern)] for b in range(batch)]  # batches over 8 repeat it
    shift = {1: 0, 64: 3, 2048: 1}.get(topk, 2)  # batch 1 sees several kinds over topk
    logits = torch.empty(batch, length)
    for b, n in enumerate(lens):
        logits[b] = _scores((_KINDS[b % len(_KINDS)] + shift) % 4, length, gen)
        logits[b, n:] = float("inf") if b == 1 else -float("inf")
    pages = -(-length // PAGE_SIZE)
    table = torch.randperm(batch * pages + 3, generator=gen)[: batch * pages]
    table = table.view(batch, pages).to(torch.int32)
    return logits, torch.tensor(lens, dtype=torch.int32), table


def _check(out: torch.Tensor, logits, seq_lens, table, topk: int) -> None:
    batch, length = logits.shape
    assert out.shape == (batch, topk) and out.dtype == torch.int32
    # Slot -> position in the row, through the inverse of the row's page table.
    for b in range(batch):
        n = min(max(int(seq_lens[b]), 0), length)
        kk = min(topk, n)
        row = out[b].long()
        assert (row[kk:] == -1).all(), f"row {b}: -1 must follow the {kk} chosen"
        slots = row[:kk]
        page_of = {int(p): i for i, p in enumerate(table[b].tolist())}
        assert all(int(s) // PAGE_SIZE in page_of for s in slots), f"row {b}: foreign page"
        pos = torch.tensor(
            [page_of[int(s) // PAGE_SIZE] * PAGE_SIZE + int(s) % PAGE_SIZE for s in slots],
            dtype=torch.long,
        )
        assert pos.unique().numel() == kk, f"row {b}: a position twice"
        assert ((pos >= 0) & (pos < n)).all(), f"row {b}: a position past seq_len {n}"
        want = torch.topk(logits[b, :n], kk).values
        got = logits[b, pos].sort(descending=True).values
        assert torch.equal(got, want), f"row {b}: other scores than torch.topk's"
        if kk:  # ties at the k-th score: the lowest positions
            kth = want[-1]
            ties = (logits[b, :n] == kth).nonzero().flatten()
            chosen = pos[logits[b, pos] == kth].sort().values
            assert torch.equal(chosen, ties[: chosen.numel()]), f"row {b}: tie order"


def _tactic(length: int) -> SelectTactic:
    # The interpreter runs programs one after another: long rows in big tiles, few programs.
    if length > 10000:
        return SelectTactic(chunk=16384, tile=4096)
    return SelectTactic(chunk=2048, tile=512)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "batch,length,topk",
    [
        # Long rows (the multi-chunk path) of several requests: ~1-3 s each on 2 cores, in
        # the slow step; one request of them stays here (the main suite stays under 10
        # minutes).
        pytest.param(b, n, k, marks=pytest.mark.slow) if n == 65536 and b > 1 else (b, n, k)
        for b in (1, 3, 8)
        for n in (1, 7, 2047, 2048, 2049, 5000, 65536)
        for k in (1, 64, 2048)
    ],
)
def test_radix_select_matches_torch_topk(batch, length, topk):
    logits, seq_lens, table = _case(batch, length, topk)
    out = radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, topk, _tactic(length))
    _check(out, logits, seq_lens, table, topk)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "tactic",
    [
        # the first two (3-4 s each on 2 cores) in the slow step CI also runs
        pytest.param(
            SelectTactic(chunk=256, tile=256, reps=1), marks=pytest.mark.slow
        ),  # many programs, one histogram
        pytest.param(
            SelectTactic(chunk=512, tile=256, reps=4), marks=pytest.mark.slow
        ),  # histogram copies
        SelectTactic(chunk=8192, tile=2048),  # one program a row
        SelectTactic(tile=256, resolve_tile=1024, resolve_warps=8),  # its own resolve step
    ],
)
def test_radix_select_tactics(tactic):
    logits, seq_lens, table = _case(8, 5000, 300, seed=1)
    out = radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, 300, tactic)
    _check(out, logits, seq_lens, table, 300)
    # The chosen set does not depend on the tactic (ties go to the lowest positions).
    again = radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, 300, SelectTactic())
    assert torch.equal(out.sort(1).values, again.sort(1).values)


@pytest.mark.interpreter
def test_select_topk_radix_and_torch_agree():
    """select_topk's two methods: the same sets on distinct scores; torch's best first."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 700, generator=gen)
    seq_lens = torch.tensor([700, 90, 0, 650], dtype=torch.int32)
    pos = torch.arange(700)
    logits = logits.masked_fill(pos[None, :] >= seq_lens[:, None].long(), -float("inf"))
    table = torch.randperm(4 * 44, generator=gen).view(4, 44).to(torch.int32)
    radix = select_topk(logits, seq_lens, table, PAGE_SIZE, 128)
    ordered = select_topk(logits, seq_lens, table, PAGE_SIZE, 128, SelectTactic(method="torch"))
    assert torch.equal(radix.sort(1).values, ordered.sort(1).values)
    with pytest.raises(ValueError, match="select.method"):
        select_topk(logits, seq_lens, table, PAGE_SIZE, 128, SelectTactic(method="heap"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tile"):
        radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, 128, SelectTactic(tile=128))


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "length"), [(1, 65536), (1, 8192), (8, 32768), (64, 8192)])
def test_radix_select_cuda_graph(batch, length):
    """DeepSeek-V3.2's topk 2048 on the GPU, captured in a CUDA graph and replayed on new
    scores (nothing of the first call's data may be baked in)."""
    topk = 2048
    logits, seq_lens, table = _case(batch, length, topk, seed=2)
    logits, seq_lens, table = logits.cuda(), seq_lens.cuda(), table.cuda()
    radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, topk)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, topk)
    for seed in (3, 4):
        fresh, _, _ = _case(batch, length, topk, seed=seed)
        logits.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        _check(out.cpu(), logits.cpu(), seq_lens.cpu(), table.cpu(), topk)


@pytest.mark.parametrize("bad", [dict(tile=100), dict(resolve_tile=128), dict(resolve_tile=3000)])
def test_radix_select_refuses_bad_tiles_by_name(bad):
    logits, seq_lens, table = _case(2, 600, 64, seed=4)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"SelectTactic.{name} must be a power of two"):
        radix_topk_slots(logits, seq_lens, table, PAGE_SIZE, 64, SelectTactic(**bad))
