"""DSA on the interpreter, over the boundaries test_dsa.py leaves open: the indexer with
request lengths one either side of, and exactly at, a program's chunk and a page (both 32
with IndexerTactic(16, 32) and pages of 32; 511 / 512 / 513 with the default 512-token
chunks and pages of 64), odd batch sizes; the sparse attention with topk one either side of
the 16-slot tile, at odd token and head counts, unsplit and split. Each against the op's
reference (dsa_topk_indexer_ref compared as index sets; dsa_sparse_attention_ref), through
test_dsa.py's inputs and checks."""

from __future__ import annotations

import pytest
import torch
from test_dsa import _assert_index_sets, _attention_inputs, _check_attention, _indexer_inputs

from flashtune.ops.dsa import dsa_sparse_attention_ref, dsa_topk_indexer_ref
from flashtune.ops.dsa.config import DEFAULT_INDEXER, AttentionTactic, IndexerTactic
from flashtune.ops.dsa.launch import run_indexer, run_sparse_attention

SMALL = IndexerTactic(block_n=16, chunk=32)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("seq_lens", "page_size", "topk", "tactic"),
    [
        ([31, 32, 33, 1, 17], 32, 24, SMALL),  # chunk and page 32: -1, exact, +1; odd batch
        ([511, 512, 513], 64, 40, DEFAULT_INDEXER),  # the default 512-token chunk
    ],
    ids=["chunk32", "chunk512"],
)
def test_indexer_lengths_at_chunk_boundaries(seq_lens, page_size, topk, tactic):
    assert seq_lens[1] == tactic.chunk  # the lengths sit at the tactic's chunk
    inputs = _indexer_inputs(seq_lens, heads=3, head_dim=16, page_size=page_size, device="cpu")
    out = run_indexer(*inputs, topk=topk, tactic=tactic)
    ref = dsa_topk_indexer_ref(*inputs, topk=topk)
    assert out.shape == ref.shape == (len(seq_lens), topk)
    for b, n in enumerate(seq_lens):  # -1 exactly past the row's tokens
        assert (out[b, : min(n, topk)] >= 0).all() and (out[b, min(n, topk) :] == -1).all()
    _assert_index_sets(out, ref, inputs)


@pytest.mark.interpreter
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("topk", [15, 17])
def test_sparse_attention_topk_around_the_tile(topk, splits):
    # 5 tokens (one with a -1 tail, one with no slot, one with scattered -1), 3 heads.
    args = _attention_inputs(5, 3, 64, 16, 5, 8, topk, torch.float16, "cpu")
    tactic = AttentionTactic(block_n=16, min_split_tiles=1)
    got = run_sparse_attention(*args, 0.125, tactic=tactic, num_splits=splits)
    _check_attention(got, dsa_sparse_attention_ref(*args, 0.125), torch.float16)
    assert (got[0][2] == 0).all() and got[1][2].isneginf().all()  # no valid slot
