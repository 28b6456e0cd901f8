"""benchmarks/bench_fi072.py (issue 37): the pure parts, on the CPU: the gates, the best
FlashInfer path per shape, the version check, the deadline and the shape grids."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture()
def fi072(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("OUT", raising=False)
    sys.modules.pop("bench_fi072", None)
    import bench_fi072

    return bench_fi072


def test_gates_judge_geomean_and_every_shape(fi072):
    decode = fi072.GATES["decode"]
    assert decode.judge([1.1, 1.1, 1.0]) == {
        "n": 3,
        "geomean": pytest.approx((1.1 * 1.1 * 1.0) ** (1 / 3)),
        "min": 1.0,
        "passed": True,
    }
    assert decode.judge([1.2, 1.2, 0.94])["passed"] is False  # one shape under 0.95
    assert decode.judge([1.04, 1.04])["passed"] is False  # geomean under 1.05
    # sampling: no geomean bar, 1.5x at every batch
    assert fi072.GATES["sampling"].judge([3.0, 1.49])["passed"] is False
    assert fi072.GATES["sampling"].judge([1.5, 2.0])["passed"] is True
    # nothing measured: nothing to judge; non-finite ratios are ignored
    assert fi072.GATES["norm"].judge([])["passed"] is None
    assert fi072.GATES["act"].judge([float("nan"), 1.2])["n"] == 1
    assert fi072.GATES["prefill_paged"].describe() == "geomean >= 1, min >= 0.9"


def test_best_path_compares_only_figures_timed_alike(fi072):
    times = {
        "flashinfer_cuda_core": (0.020, "cuda_graph"),
        "flashinfer_tc_fa2": (0.015, "cuda_graph"),
        "flashinfer_xqa": (0.010, "cuda_events"),  # faster, but timed differently
    }
    assert fi072.best_path(times, "cuda_graph") == ("flashinfer_tc_fa2", 0.015)
    assert fi072.best_path(times, "cuda_events") == ("flashinfer_xqa", 0.010)
    assert fi072.best_path(times, "cpu") is None
    assert fi072.best_path({}, "cuda_graph") is None
    # a tie goes to the first name in order: the choice does not depend on dict order
    tie = {"b": (1.0, "cuda_graph"), "a": (1.0, "cuda_graph")}
    assert fi072.best_path(tie, "cuda_graph") == ("a", 1.0)


def test_geomean(fi072):
    assert fi072.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(fi072.geomean([]))


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.7.2.post1", True),
        ("0.7.2", True),
        ("0.7.10", True),
        ("0.2.14.post1", False),
        ("0.70.0", False),
        ("0.8.0", False),
        ("unknown", False),
    ],
)
def test_peer_version_check(fi072, version, ok):
    assert fi072.peer_version_ok(version) is ok


def test_main_refuses_a_flashinfer_that_is_not_0_7(fi072, monkeypatch, capsys):
    fake = types.ModuleType("flashinfer")
    fake.__version__ = "0.2.14.post1"  # type: ignore[attr-defined]
    fake.__file__ = "/somewhere/flashinfer/__init__.py"
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    with pytest.raises(SystemExit) as exc:
        fi072.main(["--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "0.2.14.post1" in err and "source scripts/flashinfer072.sh" in err


def test_main_without_flashinfer_says_how_to_get_it(fi072, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    with pytest.raises(SystemExit) as exc:
        fi072.main([])
    assert exc.value.code == 2
    assert "flashinfer072.sh" in capsys.readouterr().err


def test_help_lists_the_stages(fi072, capsys):
    with pytest.raises(SystemExit):
        fi072.main(["--help"])
    out = capsys.readouterr().out
    for word in ("--only", "--quick", "--budget-s", *fi072.FAMILIES):
        assert word in out


def test_deadline(fi072):
    now = [100.0]
    d = fi072.Deadline(5.0, clock=lambda: now[0])
    assert not d.expired() and d.left_s() == 5.0
    now[0] = 105.0
    assert d.expired()
    assert not fi072.Deadline(None).expired()


def test_a_path_that_never_worked_is_dropped(fi072):
    h = fi072.PathHealth()
    h.failed("flashinfer_tc_fa3", "RuntimeError: ninja build failed")
    assert not h.usable("flashinfer_tc_fa3")
    h.ok("flashinfer_xqa")
    h.failed("flashinfer_xqa", "one shape it cannot run")
    assert h.usable("flashinfer_xqa")  # it worked before: keep trying other shapes


def test_tally_reports_its_slowest_shape(fi072):
    t = fi072.Tally("decode", "best")
    assert t.slowest() is None and t.verdict()["passed"] is None
    t.add("b=1 kv=1024", 1.2)
    t.add("b=256 kv=1024", 0.9)
    assert t.slowest() == "b=256 kv=1024"
    assert t.verdict()["passed"] is False


def test_dense_block_table(fi072):
    indptr = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    indices = torch.tensor([5, 1, 4, 0, 2, 3], dtype=torch.int32)
    table = fi072.dense_block_table(indptr, indices)
    assert table.dtype == torch.int32
    assert table.tolist() == [[5, 1, 0], [4, 0, 0], [0, 2, 3]]


def test_shape_grids(fi072):
    full = fi072.decode_shapes(False)
    assert all(b * kv <= fi072.DECODE_MAX_TOKENS for b, kv in full)
    assert (1, 1024) in full and (256, 16384) in full and (256, 32768) not in full
    assert {b for b, _ in full} == set(fi072.DECODE_BATCHES)
    assert len(fi072.decode_shapes(True)) < len(full)
    pre = fi072.prefill_shapes(False)
    assert {b for b, _ in pre} == {1, 4, 16} and {s for _, s in pre} == {1024, 2048, 4096, 8192}
    for quick in (False, True):
        # norms and activations: only inputs above 1 MiB (bf16)
        assert all(b * h * 2 > 2**20 for h, b in fi072.norm_shapes(quick))
        assert all(t * 2 * d * 2 > 2**20 for d, t in fi072.act_shapes(quick))
        assert fi072.norm_shapes(quick) and fi072.act_shapes(quick)
    assert (2048, 256) not in fi072.norm_shapes(False)  # exactly 1 MiB: left out


def test_prefill_head_dim_flag_sets_the_prefill_shapes(fi072, monkeypatch):
    import bench_prefill

    monkeypatch.setattr(bench_prefill, "D", bench_prefill.D)  # restored after the test

    def no_peer():
        raise SystemExit(2)

    monkeypatch.setattr(fi072, "load_peer", no_peer)
    with pytest.raises(SystemExit):
        fi072.main(["--only", "prefill", "--prefill-head-dim", "256"])
    assert bench_prefill.D == 256
    assert bench_prefill.causal_flops([4]) == 4.0 * bench_prefill.HQ * 256 * 10
