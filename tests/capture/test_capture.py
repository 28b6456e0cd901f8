"""capture(): workloads and definitions written, blobs, policies end to end, bounded queue."""

from __future__ import annotations

import json
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from _capture_toys import ToyModel, toy_gather, toy_gemm, toy_norm

import flashtune
from flashtune.capture import CaptureConfig, CaptureWriter, capture
from flashtune.capture.writer import CaptureRecord
from flashtune.data import Dataset, Workload, synthesize_inputs


def _lines(root: Path, op_type: str, name: str) -> list[dict]:
    path = root / "workloads" / op_type / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_capture_writes_definitions_and_workloads(tmp_path: Path) -> None:
    model = ToyModel(hidden=16)
    with capture(dataset=tmp_path) as cap:
        for batch in (1, 3, 3, 8):
            model(torch.randn(batch, 16))
    assert cap.stats["written"] == 6 and cap.stats["dropped"] == 0
    ds = Dataset(tmp_path)
    assert set(ds.definitions) == {"toy_norm_h16", "toy_gemm_n16_k16"}
    assert ds.definitions["toy_norm_h16"] == toy_norm.definition(
        torch.randn(2, 16), torch.randn(16)
    )
    rows = _lines(tmp_path, "toy_norm", "toy_norm_h16")
    assert [r["workload"]["axes"] for r in rows] == [
        {"batch_size": 1},
        {"batch_size": 3},
        {"batch_size": 8},
    ]
    assert all(r["workload"]["inputs"]["hidden_states"] == {"type": "random"} for r in rows)
    assert ds.load_all() == []


def test_top_level_name_is_callable(tmp_path: Path) -> None:
    # `import flashtune.capture` rebinds flashtune.capture to the package: it must still call.
    with flashtune.capture(dataset=tmp_path) as cap:
        toy_gemm(torch.randn(2, 4), torch.randn(4, 4))
    assert cap.stats["written"] == 1
    assert flashtune.CaptureConfig is CaptureConfig


def test_dump_int_writes_index_blob_and_scalars(tmp_path: Path) -> None:
    indices = torch.tensor([4, 0, 2], dtype=torch.int64)
    with capture(dataset=tmp_path, default=CaptureConfig("dump_int", "keep_all")):
        toy_gather(torch.randn(5, 4), indices, scale=0.25)
    (row,) = _lines(tmp_path, "toy_gather", "toy_gather_d4")
    inputs = row["workload"]["inputs"]
    assert inputs["table"] == {"type": "random"}
    assert inputs["scale"] == {"type": "scalar", "value": 0.25}
    assert inputs["indices"]["type"] == "safetensors"
    ds = Dataset(tmp_path)
    assert ds.blob_path(inputs["indices"]["path"]).exists()
    workload = Workload.model_validate(row["workload"])
    replay = synthesize_inputs(ds.definitions["toy_gather_d4"], workload, blob_root=ds)
    assert torch.equal(replay["indices"], indices)
    assert replay["scale"] == 0.25


@pytest.mark.parametrize(
    ("policy", "dumped"),
    [("dump_all", {"table", "indices"}), ("dump_none", set()), (["table"], {"table"})],
)
def test_dump_policies_end_to_end(tmp_path: Path, policy, dumped) -> None:
    table = torch.randn(5, 4)
    with capture(dataset=tmp_path, default=CaptureConfig(policy, "keep_all")):
        toy_gather(table, torch.tensor([1, 2]), 1.0)
    (row,) = _lines(tmp_path, "toy_gather", "toy_gather_d4")
    got = {n for n, s in row["workload"]["inputs"].items() if s["type"] == "safetensors"}
    assert got == dumped
    if "table" in dumped:
        ds = Dataset(tmp_path)
        replay = synthesize_inputs(
            ds.definitions["toy_gather_d4"], Workload.model_validate(row["workload"]), blob_root=ds
        )
        assert torch.equal(replay["table"], table)


def test_dump_snapshot_is_taken_at_call_time(tmp_path: Path) -> None:
    indices = torch.tensor([1, 2, 3])
    with capture(dataset=tmp_path, default=CaptureConfig("dump_int", "keep_all")):
        toy_gather(torch.randn(5, 4), indices, 1.0)
        indices.fill_(0)  # the program reuses its buffer right after the call
    (row,) = _lines(tmp_path, "toy_gather", "toy_gather_d4")
    ds = Dataset(tmp_path)
    replay = synthesize_inputs(
        ds.definitions["toy_gather_d4"], Workload.model_validate(row["workload"]), blob_root=ds
    )
    assert replay["indices"].tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    ("policy", "count"),
    [
        ("keep_all", 6),
        ("keep_first", 1),
        ("keep_first_k", 2),
        ("keep_first_k_by_axes", 5),
        ("shape_only", 3),
        ("keep_none", 0),
    ],
)
def test_filter_policies_end_to_end(tmp_path: Path, policy, count) -> None:
    with capture(dataset=tmp_path, default=CaptureConfig("dump_none", policy, k=2)):
        for m in (1, 2, 2, 2, 3, 1):
            toy_gemm(torch.randn(m, 4), torch.randn(4, 4))
    assert len(_lines(tmp_path, "toy_gemm", "toy_gemm_n4_k4")) == count
    assert (tmp_path / "definitions").exists() == (count > 0)


def test_configs_by_op_type_and_default_none(tmp_path: Path) -> None:
    configs = {"toy_gemm": CaptureConfig("dump_none", "keep_all")}
    with capture(dataset=tmp_path, configs=configs, default=None):
        ToyModel(hidden=8)(torch.randn(2, 8))
    assert len(_lines(tmp_path, "toy_gemm", "toy_gemm_n8_k8")) == 2
    assert _lines(tmp_path, "toy_norm", "toy_norm_h8") == []


def test_leading_dims_are_merged(tmp_path: Path) -> None:
    with capture(dataset=tmp_path, default=CaptureConfig("dump_all", "keep_all")):
        toy_norm(torch.randn(2, 3, 8), torch.randn(8))
    (row,) = _lines(tmp_path, "toy_norm", "toy_norm_h8")
    assert row["workload"]["axes"] == {"batch_size": 6}
    ds = Dataset(tmp_path)
    replay = synthesize_inputs(
        ds.definitions["toy_norm_h8"], Workload.model_validate(row["workload"]), blob_root=ds
    )
    assert replay["hidden_states"].shape == (6, 8)


def test_bad_calls_are_not_recorded_and_still_raise(tmp_path: Path) -> None:
    with capture(dataset=tmp_path, default=CaptureConfig("dump_none", "keep_all")):
        with pytest.raises(RuntimeError):
            toy_gemm(torch.randn(2, 4), torch.randn(4, 5))  # K mismatch: bind fails, op raises
    assert not (tmp_path / "workloads").exists()


def test_capture_off_records_nothing(tmp_path: Path) -> None:
    toy_gemm(torch.randn(2, 4), torch.randn(4, 4))
    assert not tmp_path.joinpath("workloads").exists()


def _record(i: int, nbytes: int = 0) -> CaptureRecord:
    definition = toy_gemm.definition(torch.randn(1, 4), torch.randn(4, 4))
    return CaptureRecord(definition, Workload(uuid=f"u{i}", axes={"M": i}, inputs={}))


def test_full_queue_drops_with_one_warning_and_never_blocks(tmp_path: Path) -> None:
    writer = CaptureWriter(Dataset(tmp_path), max_records=3)  # not started: nothing drains
    accepted: list[bool] = []

    def submit_all() -> None:
        accepted.extend(writer.submit(0, lambda i=i: _record(i)) for i in range(10))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Nothing drains the queue: a submit that waited for room would never return (the
        # join's timeout only keeps a broken build from hanging the suite).
        submitter = threading.Thread(target=submit_all, daemon=True)
        submitter.start()
        submitter.join(timeout=60)
    assert not submitter.is_alive(), "submit blocked on a full queue"
    assert accepted == [True] * 3 + [False] * 7
    assert writer.dropped == 7 and writer.pending == 3
    assert len([w for w in caught if "queue is full" in str(w.message)]) == 1
    writer.close()  # flushes what was queued
    assert len(_lines(tmp_path, "toy_gemm", "toy_gemm_n4_k4")) == 3


def test_byte_bound_and_no_copy_for_dropped(tmp_path: Path) -> None:
    writer = CaptureWriter(Dataset(tmp_path), max_records=100, max_bytes=1000)
    made = []

    def make(i: int) -> CaptureRecord:
        made.append(i)
        return _record(i)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [writer.submit(400, lambda i=i: make(i)) for i in range(4)]
    assert results == [True, True, False, False]
    assert made == [0, 1]  # a dropped record never built (no tensor copy)
    assert writer.queued_bytes == 800
    writer.close()
    assert writer.queued_bytes == 0 and writer.written == 2


def test_background_thread_drains(tmp_path: Path) -> None:
    writer = CaptureWriter(Dataset(tmp_path)).start()
    for i in range(5):
        writer.submit(0, lambda i=i: _record(i))
    deadline = time.monotonic() + 5
    while writer.written < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.written == 5
    writer.close()


def test_capture_and_apply_together_still_capture(tmp_path: Path) -> None:
    from flashtune.apply import enable_apply

    handle = enable_apply(dataset=tmp_path / "empty")
    try:
        with capture(dataset=tmp_path, default=CaptureConfig("dump_none", "keep_all")) as cap:
            toy_gemm(torch.randn(2, 4), torch.randn(4, 4))
        assert cap.stats["written"] == 1
    finally:
        handle.disable()


@pytest.mark.cuda
def test_cuda_graph_capture_is_not_recorded(tmp_path: Path) -> None:
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 16, device="cuda")
    with capture(dataset=tmp_path, default=CaptureConfig("dump_all", "keep_all")) as cap:
        toy_gemm(a, b)  # warm-up, recorded (pinned side-stream copy)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with pytest.warns(RuntimeWarning, match="CUDA graph"), torch.cuda.graph(graph):
            toy_gemm(a, b)
        graph.replay()
    assert cap.stats["written"] == 1
    (row,) = _lines(tmp_path, "toy_gemm", "toy_gemm_n16_k16")
    ds = Dataset(tmp_path)
    replay = synthesize_inputs(
        ds.definitions["toy_gemm_n16_k16"], Workload.model_validate(row["workload"]), blob_root=ds
    )
    assert torch.equal(replay["A"], a.cpu())


def test_capture_run_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flashtune.cli import app

    script = tmp_path / "prog.py"
    here = str(Path(__file__).resolve().parent)
    script.write_text(
        f"import sys, torch\nsys.path.insert(0, {here!r})\n"
        "from _capture_toys import toy_gemm\n"
        "for m in range(1, int(sys.argv[1]) + 1):\n"
        "    toy_gemm(torch.randn(m, 4), torch.randn(4, 4))\n"
    )
    root = tmp_path / "ds"
    result = CliRunner().invoke(
        app, ["capture", "run", str(script), "3", "--dataset", str(root), "--dump", "dump_none"]
    )
    assert result.exit_code == 0, result.output
    assert len(_lines(root, "toy_gemm", "toy_gemm_n4_k4")) == 3


def test_calls_of_another_dtype_are_not_recorded_under_a_definition(tmp_path: Path) -> None:
    # Definition names carry no dtype: float32 and float16 calls of toy_norm at hidden 16 both
    # name toy_norm_h16. The first fixes its dtypes; the other's calls are skipped, warned once.
    w = torch.rand(16) + 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(dataset=tmp_path) as cap:
            toy_norm(torch.randn(2, 16), w)
            for batch in (2, 3, 3, 5):  # float16: skipped (2 is also a float32 signature)
                toy_norm(torch.randn(batch, 16).half(), w.half())
            toy_norm(torch.randn(3, 16), w)  # float32 again: still recorded
            toy_norm(torch.randn(5, 16), w)  # a shape skipped in float16: recorded
    dtype_warnings = [w for w in caught if "dtypes" in str(w.message)]
    assert len(dtype_warnings) == 1 and "float16" in str(dtype_warnings[0].message)
    assert cap.stats["written"] == 3
    ds = Dataset(tmp_path)
    assert ds.definitions["toy_norm_h16"].inputs["hidden_states"].dtype == "float32"
    rows = _lines(tmp_path, "toy_norm", "toy_norm_h16")
    assert [r["workload"]["axes"]["batch_size"] for r in rows] == [2, 3, 5]


def test_the_datasets_definition_fixes_the_dtypes(tmp_path: Path) -> None:
    # A dataset that already has toy_norm_h16 in float16 (a corpus definition, say): float32
    # calls are not written under it; float16 calls are.
    ds = Dataset(tmp_path)
    ds.add_definition(toy_norm.definition(torch.randn(2, 16).half(), torch.randn(16).half()))
    w = torch.rand(16) + 0.5
    with pytest.warns(RuntimeWarning, match="float32"):
        with capture(dataset=ds) as cap:
            toy_norm(torch.randn(4, 16), w)
            toy_norm(torch.randn(7, 16).half(), w.half())
    assert cap.stats["written"] == 1
    rows = _lines(tmp_path, "toy_norm", "toy_norm_h16")
    assert [r["workload"]["axes"]["batch_size"] for r in rows] == [7]
