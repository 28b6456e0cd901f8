"""Solutions made from the op schemas for any dataset's definitions (flashtune.ops.bundle.supply,
`flashtune solutions add`, `flashtune run --with / --reference-only`).

Two sets of FlashInfer-Trace definitions: the visible corpus (FLASHTUNE_TRACE_CORPUS, skipped
saying why where absent) and all 156 definitions of flashinfer-ai/flashinfer-bench at commit
ecafa9c (the dataset's last in-repository version, held-out families included), unchanged, in
tests/dataset/data/ (see its README). A definition is one flashtune "has a kernel for" when
an op schema emits its name at its constants; each of those must get flashtune's and torch's
solutions, whatever layout the dataset gives it.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from _ecafa9c import ecafa9c_files, write_ecafa9c
from flashtune.bench.build import build_solution
from flashtune.bench.correctness import compare_outputs
from flashtune.cli import app
from flashtune.data import (
    Dataset,
    Definition,
    Trace,
    outputs_as_dict,
    run_reference,
    small_workload,
    synthesize_inputs,
)
from flashtune.ops import load_all
from flashtune.ops.bundle.supply import (
    Supply,
    match_schema,
    reference_solution,
    schema_names,
    schemas_by_prefix,
    supply_all,
)

load_all()


def _definitions(root: Path) -> list[Definition]:
    return [
        Definition.model_validate_json(p.read_text())
        for p in sorted((root / "definitions").rglob("*.json"))
    ]


def _has_kernel(definition: Definition) -> bool:
    """An op schema emits this definition's name at its constants (flashtune runs the op)."""
    return schema_names(definition)


def _check_coverage(found: list[Supply]) -> Counter[str]:
    """Every definition flashtune has a kernel for gets flashtune's and torch's solutions;
    returns the supplied definitions per op type."""
    for item in found:
        if not _has_kernel(item.definition):
            continue
        kinds = {s.name.split("@")[0] for s in item.solutions}
        assert {"flashtune", "torch"} <= kinds, (item.definition.name, item.problems)
        for solution in item.solutions:
            assert solution.definition == item.definition.name
            # Its source imports and binds `run` (no kernel runs), which takes the
            # definition's inputs in order (a missing one is a TypeError at the first call).
            run = build_solution(solution)
            inspect.signature(run).bind(*item.definition.inputs)
    return Counter(s.definition.op_type for s in found if s.supplied)


def test_ecafa9c_fixture_is_the_156_definitions() -> None:
    files = ecafa9c_files()
    assert len(files) == 156
    for text in files.values():
        Definition.model_validate_json(text)


def test_every_ecafa9c_definition_of_a_kernel_gets_solutions(tmp_path: Path) -> None:
    definitions = _definitions(write_ecafa9c(tmp_path))
    found = supply_all(definitions)
    supplied = _check_coverage(found)
    kernels = Counter(d.op_type for d in definitions if _has_kernel(d))
    # Every family with a kernel is covered whole: its definitions all get solutions.
    assert {t: supplied[t] for t in kernels} == dict(kernels)
    assert sum(supplied.values()) >= sum(kernels.values()) > 100
    # The layouts FlashInfer-Trace uses beside the schemas' own are adapted, not refused.
    layouts = Counter(layout.name for s in found if s.match for layout in s.match.layouts)
    assert len(layouts) == 2, layouts
    # A definition no schema has says why.
    for item in found:
        if not item.supplied:
            assert item.problems and item.definition.name in item.problems[0]


def test_every_visible_corpus_definition_of_a_kernel_gets_solutions(trace_corpus: Path) -> None:
    definitions = _definitions(trace_corpus)
    supplied = _check_coverage(supply_all(definitions))
    kernels = Counter(d.op_type for d in definitions if _has_kernel(d))
    assert {t: supplied[t] for t in kernels} == dict(kernels)


def test_the_bundled_definitions_get_their_bundled_solutions() -> None:
    """On the bundled dataset, the schemas' solutions are the bundled ones, byte for byte
    (same names, same sources): one rule, two uses."""
    from flashtune.cli import bundled_dataset

    ds = Dataset(bundled_dataset())
    for item in supply_all(ds.definitions.values()):
        theirs = {s.name: s for s in ds.solutions_for(item.definition.name)}
        ours = {s.name: s for s in item.solutions}
        if item.match is None:  # an op whose schema names its definitions otherwise
            continue
        assert set(ours) == set(theirs), item.definition.name
        for name, solution in ours.items():
            assert solution.sources == theirs[name].sources, name


def _by_name(tmp_path: Path, name: str) -> Definition:
    (definition,) = [d for d in _definitions(write_ecafa9c(tmp_path)) if d.name == name]
    return definition


@pytest.mark.parametrize(
    "name",
    [
        "gqa_paged_decode_h32_kv8_d128_ps1",  # page size 1, no kv_last_page_len
        "gqa_paged_prefill_causal_h32_kv8_d128_ps64",  # kv_last_page_len of len_indptr entries
        "gqa_paged_prefill_causal_h32_kv8_d128_ps1",  # page size 1: the schema has none either
        "rmsnorm_h128",  # eps 1e-6 (the bundled entries' default is 1e-5)
    ],
)
def test_adapted_torch_solution_matches_the_definitions_reference(
    tmp_path: Path, name: str
) -> None:
    definition = _by_name(tmp_path, name)
    match = match_schema(definition)
    assert not isinstance(match, str), match
    (item,) = supply_all([definition], kinds=["torch"])
    (solution,) = item.solutions
    workload = small_workload(definition)
    inputs = synthesize_inputs(definition, workload, seed=3)
    expected = run_reference(definition, inputs)
    got = outputs_as_dict(definition, build_solution(solution)(*inputs.values()))
    verdict = compare_outputs(definition, expected, got)
    assert verdict.status.value == "PASSED", verdict.reason


def test_an_entry_that_cannot_take_the_constant_is_refused(tmp_path: Path) -> None:
    """A reference fixing a constant the entries compute otherwise gets no solution."""
    definition = _by_name(tmp_path, "rope_with_cos_sin_cache_neox_style_d128_rd64")
    assert supply_all([definition])[0].supplied
    gptj = definition.reference.replace("is_neox=True", "is_neox=False")
    if gptj == definition.reference:
        gptj = definition.reference.replace("IS_NEOX = True", "IS_NEOX = False")
    changed = definition.model_copy(update={"reference": gptj})
    if gptj != definition.reference:
        (item,) = supply_all([changed])
        assert not item.supplied and "is_neox" in "; ".join(item.problems)
    else:  # its reference does not spell is_neox: it is the name's (neox_style) alone
        assert match_schema(changed) is not None


def test_reference_solution_is_the_reference(tmp_path: Path) -> None:
    definition = _by_name(tmp_path, "rmsnorm_h128")
    solution = reference_solution(definition)
    assert solution.author == "baseline"  # FlashInfer-Bench HEAD's summary needs one
    inputs = synthesize_inputs(definition, small_workload(definition), seed=1)
    got = outputs_as_dict(definition, build_solution(solution)(*inputs.values()))
    expected = run_reference(definition, inputs)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_solutions_add_writes_a_dataset_flashtune_reads(tmp_path: Path) -> None:
    root = write_ecafa9c(tmp_path / "ds")
    result = CliRunner().invoke(
        app, ["solutions", "add", str(root), "--with", "flashtune,torch", "--op-type", "rmsnorm"]
    )
    assert result.exit_code == 0, result.output
    ds = Dataset(root)
    assert ds.load_all() == []
    rmsnorm = ds.find_definitions("rmsnorm", None)
    assert rmsnorm and all(
        {s.name.split("@")[0] for s in ds.solutions_for(d.name)} == {"flashtune", "torch"}
        for d in rmsnorm
    )
    again = CliRunner().invoke(app, ["solutions", "add", str(root), "--with", "cuda"])
    assert again.exit_code == 2 and "--with cuda" in again.output


@pytest.mark.slow
def test_run_with_and_reference_only_on_cpu(tmp_path: Path) -> None:
    """`flashtune run --with torch` and `--reference-only` on a FlashInfer-Trace definition
    with no solution of its own (synthesized workloads: one small input set)."""
    root = write_ecafa9c(tmp_path / "ds")
    definition = Dataset(root).definition("rmsnorm_h128")
    Dataset(root).add_workloads(definition, [small_workload(definition)])
    for options, solution in (
        (["--with", "torch"], "torch@"),
        (["--reference-only"], "reference@"),
    ):
        out = tmp_path / f"out{solution}"
        result = CliRunner().invoke(
            app,
            ["run", "-d", str(root), "--definitions", "rmsnorm_h128", "--devices", "cpu"]
            + ["-q", "-o", str(out), "--no-bundled-solutions", *options],
        )
        assert result.exit_code == 0, result.output
        traces = Dataset(out).all_traces()
        assert traces and all(t.solution.startswith(solution) for t in traces)
        assert {t.evaluation.status.value for t in traces} == {"PASSED"}


def _coverage_script() -> Any:
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "scripts" / "coverage_table.py"
    spec = importlib.util.spec_from_file_location("coverage_table", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_coverage_columns_from_gpu_traces(tmp_path: Path) -> None:
    """PASS on GPU and the ratio vs FlashInfer come from the traces given (CPU ones ignored)."""
    ds = Dataset(tmp_path)

    def trace(solution: str, uuid: str, latency: float, hardware: str, status: str) -> Trace:
        performance = {"latency_ms": latency, "reference_latency_ms": 1.0, "speedup_factor": 1.0}
        return Trace.model_validate(
            {
                "definition": "rmsnorm_h128",
                "workload": {"uuid": uuid, "axes": {"batch_size": 1}, "inputs": {}},
                "solution": solution,
                "evaluation": {
                    "status": status,
                    "environment": {"hardware": hardware},
                    "timestamp": "t",
                    **(
                        {"correctness": {}, "performance": performance}
                        if status == "PASSED"
                        else {}
                    ),
                },
            }
        )

    for t in (
        trace("flashtune@rmsnorm_h128", "a", 1.0, "NVIDIA H100", "PASSED"),
        trace("flashinfer@rmsnorm_h128", "a", 2.0, "NVIDIA H100", "PASSED"),
        trace("flashtune@rmsnorm_h128", "b", 1.0, "NVIDIA H100", "PASSED"),
        trace("flashinfer@rmsnorm_h128", "b", 0.5, "NVIDIA H100", "PASSED"),
        trace("flashtune@rmsnorm_h128", "c", 9.0, "cpu", "RUNTIME_ERROR"),  # not a GPU trace
    ):
        ds.append_trace(t, author=t.solution.split("@")[0])
    passed, ratios = _coverage_script().measured([tmp_path])
    assert passed == {"rmsnorm_h128": True}
    assert sorted(ratios["rmsnorm_h128"]) == [0.5, 2.0]


def test_coverage_columns_from_committed_rows(tmp_path: Path) -> None:
    """The newest GPU run of a definition in the result rows decides its PASS column; CPU
    rows and older runs do not; the ratio pairs FlashInfer and flashtune per shape."""

    def row(op: str, solution: str, status: str, run: str, gpu: str = "NVIDIA H200", ms=1.0):
        return {"op": op, "shape": {"n": 1}, "solution": solution, "status": status,
                "gpu": gpu, "run_started": run, "latency_ms": ms}  # fmt: skip

    rows = [
        row("a", "flashtune", "RUNTIME_ERROR", "2026-01-01"),  # older: superseded
        row("a", "flashtune", "PASSED", "2026-02-01", ms=2.0),
        row("a", "flashinfer", "PASSED", "2026-02-01", ms=3.0),
        row("b", "flashtune", "INCORRECT_NUMERICAL", "2026-02-01"),
        row("c", "flashtune", "PASSED", "2026-03-01", gpu="cpu"),  # not a GPU row
        row("d", "torch", "PASSED", "2026-03-01"),  # no flashtune row
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    passed, ratios = _coverage_script().measured_rows((path, tmp_path / "absent.jsonl"))
    assert passed == {"a": True, "b": False}
    assert ratios == {"a": [1.5]}


def test_solutions_coverage_command(tmp_path: Path) -> None:
    root = write_ecafa9c(tmp_path / "ds")
    result = CliRunner().invoke(app, ["solutions", "coverage", str(root)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "gqa_ragged" in line)
    kernels = sum(schema_names(d) for d in _definitions(root) if d.op_type == "gqa_ragged")
    cells = [cell.strip() for cell in row.split("│")[2:5]]  # definitions, matched, supplied
    assert cells == [str(kernels)] * 3


def test_coverage_doc_is_current(trace_corpus: Path) -> None:
    """docs/coverage.md is what scripts/coverage_table.py computes (no GPU traces given)."""
    module = _coverage_script()
    assert module.main(["--check", "--corpus", str(trace_corpus)]) == 0, (
        "docs/coverage.md is not current: python scripts/coverage_table.py"
    )


def test_an_op_may_make_the_schema_of_a_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An op whose registered schemas are templates (per call key) answers
    schema_for_definition: its definitions at other keys are matched through it."""
    from flashtune.schema import REGISTRY

    definition = _by_name(tmp_path, "rmsnorm_h128")
    (rmsnorm,) = schemas_by_prefix()["rmsnorm"]

    class TemplateOp:
        schemas = ()

        @staticmethod
        def schema_for_definition(d: Definition) -> Any:
            return rmsnorm if d.name.startswith("rmsnorm_") else None

    assert isinstance(match_schema(definition, schemas={}), str)  # no prefix of it known
    monkeypatch.setitem(REGISTRY, "tests.template_op", TemplateOp())
    matched = match_schema(definition, schemas={})
    assert not isinstance(matched, str) and matched.schema is rmsnorm
    assert schema_names(definition, schemas={})


# --------------------------------------------------------------------------- the fused MoE

# ecafa9c's fp8 MoE definitions, and the routing constants each supplied solution passes its
# entry beside what the inputs say (none: the entry's defaults are the definition's).
FP8_MOE = {
    "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048": "",
    "moe_fp8_block_scale_ds_routing_topk8_ng1_kg1_e384_h7168_i2048": "n_group=1, topk_group=1",
    "moe_fp8_block_scale_ds_routing_topk8_ng1_kg1_e48_h7168_i2048": "n_group=1, topk_group=1",
    "moe_fp8_block_scale_renorm_topk10_e128_h2048_i512": "top_k=10",
    "moe_fp8_block_scale_renorm_topk8_e128_h2048_i768": "top_k=8",
    "moe_fp8_block_scale_renorm_topk8_e128_h4096_i1536": "top_k=8",
    "trtllm_fp8_per_tensor_scale_moe_topk1_e128_h5120_i8192": "routing_method_type=3, top_k=1",
    "trtllm_fp8_per_tensor_scale_moe_topk1_e16_h5120_i8192": "routing_method_type=3, top_k=1",
    "trtllm_fp8_per_tensor_scale_moe_topk8_e128_h2048_i768": "top_k=8",
}
# Its fp4 MoE definitions (float32 weights in their contract): the float32-weight entries.
FP4_MOE = {
    "trtllm_fp4_block_scale_moe_topk10_e128_h2048_i512": "top_k=10",
    "trtllm_fp4_block_scale_moe_topk1_e128_h5120_i8192": "routing_method_type=3, top_k=1",
    "trtllm_fp4_block_scale_moe_topk1_e16_h5120_i8192": "routing_method_type=3, top_k=1",
    "trtllm_fp4_block_scale_moe_topk8_e128_h2048_i768": "top_k=8",
    "trtllm_fp4_block_scale_moe_topk8_e64_h4096_i1536": "top_k=8",
    "trtllm_fp4_block_scale_routed_moe_topk10_e128_h2048_i512": "",
    "trtllm_fp4_block_scale_routed_moe_topk1_e128_h5120_i8192": "routing_method_type=3",
    "trtllm_fp4_block_scale_routed_moe_topk1_e16_h5120_i8192": "routing_method_type=3",
    "trtllm_fp4_block_scale_routed_moe_topk8_e128_h2048_i768": "",
    "trtllm_fp4_block_scale_routed_moe_topk8_e64_h4096_i1536": "",
}
F8 = torch.float8_e4m3fn


def _moe_supplied(tmp_path: Path) -> dict[str, Supply]:
    definitions = [d for d in _definitions(write_ecafa9c(tmp_path)) if d.op_type == "moe"]
    return {s.definition.name: s for s in supply_all(definitions)}


def test_the_moe_definitions_get_flashtune_and_torch_solutions(tmp_path: Path) -> None:
    """The op makes each MoE definition's schema (its routing constants are in its name
    only); the bundled entries are told the constants they differ in. FlashInfer's MoE runs
    on SM100 only: no FlashInfer solution. The fp4 ones (float32 weights in their contract)
    get the float32-weight entries."""
    found = _moe_supplied(tmp_path)
    assert len(found) == 19
    for name, keywords in {**FP8_MOE, **FP4_MOE}.items():
        item = found[name]
        assert schema_names(item.definition), name
        assert not item.problems, item.problems
        assert {s.name.split("@")[0] for s in item.solutions} == {"flashtune", "torch"}
        for solution in item.solutions:
            source = solution.sources[0].content
            if keywords:
                assert source.rstrip().count(keywords) == 1, (name, source)
            else:  # the bundled op's constants (a routed one's top_k: topk_ids' width): the
                # bundled source
                assert "import adapted" not in source
            build_solution(solution)
    result = CliRunner().invoke(app, ["solutions", "coverage", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "without solutions" not in result.output, result.output


def _quant_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, r, c = x.shape
    blocks = x.float().reshape(*lead, r // 128, 128, c // 128, 128)
    scale = blocks.abs().amax(dim=(-3, -1)) / 448.0 + 1e-12
    return (blocks / scale[..., :, None, :, None]).to(F8).reshape(x.shape), scale


def _block_inputs(experts: int, local: int, ds: bool, gen: torch.Generator) -> list[Any]:
    """A definition's inputs at a tiny shape (2 tokens, hidden 256, experts of 128)."""
    tokens, hidden, inter = 2, 256, 128
    a = torch.randn(tokens, hidden, generator=gen) * 2
    groups = a.reshape(tokens, hidden // 128, 128)
    a_scale = groups.abs().amax(-1) / 448.0 + 1e-12
    hidden_states = (groups / a_scale[..., None]).to(F8).reshape(tokens, hidden)
    w13, s13 = _quant_blocks(torch.randn(local, 2 * inter, hidden, generator=gen) * 0.05)
    w2, s2 = _quant_blocks(torch.randn(local, hidden, inter, generator=gen) * 0.05)
    logits = torch.randn(tokens, experts, generator=gen)
    if not ds:
        return [logits.to(torch.bfloat16), hidden_states, a_scale.t().contiguous(), w13, s13,
                w2, s2]  # fmt: skip
    bias = (torch.randn(experts, generator=gen) * 0.1).to(torch.bfloat16)
    return [logits, bias, hidden_states, a_scale.t().contiguous(), w13, s13, w2, s2,
            experts - local, 2.5]  # fmt: skip


def _per_tensor_inputs(experts: int, llama4: bool, gen: torch.Generator) -> list[Any]:
    tokens, hidden, inter = 2, 128, 64
    hs = (torch.randn(tokens, hidden, generator=gen) * 4).to(F8)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 4).to(F8)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 4).to(F8)
    s1, s1g, s2 = (torch.rand(experts, generator=gen) * 0.01 + 0.001 for _ in range(3))
    logits = torch.randn(tokens, experts, generator=gen).to(torch.bfloat16)
    bias = [torch.randn(experts, generator=gen).to(torch.bfloat16)] if llama4 else []
    return [logits, hs, w13, s1, s1g, w2, s2, *bias]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    g, w = got.float(), want.float()
    assert got.shape == want.shape and w.abs().max() > 0
    assert (g - w).norm() <= 3e-2 * w.norm(), ((g - w).norm() / w.norm()).item()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "moe_fp8_block_scale_ds_routing_topk8_ng1_kg1_e48_h7168_i2048",
        "moe_fp8_block_scale_renorm_topk10_e128_h2048_i512",
        "trtllm_fp8_per_tensor_scale_moe_topk1_e16_h5120_i8192",
    ],
)
def test_supplied_moe_solutions_compute_the_definitions_routing(tmp_path: Path, name: str) -> None:
    """The supplied solutions pass the definition's routing constants: run on tiny tensors
    (their sizes read from the tensors), they are flashtune's reference at those constants,
    not at the bundled op's (ng8_kg4, topk4, Renormalize)."""
    from flashtune.ops.moe.reference import moe_fp8_block_scale_ref, moe_fp8_per_tensor_scale_ref

    item = _moe_supplied(tmp_path)[name]
    gen = torch.Generator().manual_seed(5)
    if name.startswith("trtllm"):
        inputs = _per_tensor_inputs(16, True, gen)
        logits, hs, w13, s1, s1g, w2, s2 = inputs[:7]  # the bias (last) is Llama4's, unread

        def per_tensor(method: int, top_k: int) -> torch.Tensor:
            return moe_fp8_per_tensor_scale_ref(
                logits, hs, w13, s1, s1g, w2, s2, None, 0, None, method, top_k
            )

        want, bundled = per_tensor(3, 1), per_tensor(1, 4)
    else:
        ds = "_ds_" in name
        inputs = _block_inputs(32, 8, True, gen) if ds else _block_inputs(16, 16, False, gen)
        logits, bias, offset, scale = (
            (inputs[0], inputs[1], inputs[8], inputs[9]) if ds else (inputs[0], None, 0, None)
        )
        hs, hs_scale, w13, w13_scale, w2, w2_scale = inputs[2:8] if ds else inputs[1:7]

        def block_scale(method: int, top_k: int, groups: tuple[int, int] | None) -> torch.Tensor:
            n_group, topk_group = groups or (None, None)
            return moe_fp8_block_scale_ref(
                logits, hs, hs_scale, w13, w13_scale, w2, w2_scale, bias, offset, scale, method,
                top_k, n_group, topk_group,
            )  # fmt: skip

        if ds:
            want, bundled = block_scale(2, 8, (1, 1)), block_scale(2, 8, (8, 4))
        else:
            want, bundled = block_scale(1, 10, None), block_scale(1, 4, None)
    assert not torch.equal(want, bundled)  # the constants matter at this shape
    for solution in item.solutions:
        got = build_solution(solution)(*inputs)
        if solution.name.startswith("torch@"):
            assert torch.equal(got, want), solution.name
        else:
            _close(got, want)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
        "trtllm_fp8_per_tensor_scale_moe_topk8_e128_h2048_i768",
    ],
)
def test_supplied_moe_solutions_match_the_definitions_reference(tmp_path: Path, name: str) -> None:
    """The supplied solutions against the definition's own reference, at one token: the
    references hard-code their models' shapes (hidden 7168, 32 experts of 2048: about 1 GB of
    fp8 weights), so this takes minutes on a 2-core CPU (slow)."""
    definition = _by_name(tmp_path, name)
    (item,) = supply_all([definition])
    inputs = synthesize_inputs(definition, small_workload(definition, size=1), seed=3)
    expected = run_reference(definition, inputs)
    for solution in item.solutions:
        got = outputs_as_dict(definition, build_solution(solution)(*inputs.values()))
        verdict = compare_outputs(definition, expected, got)
        assert verdict.status.value == "PASSED", (solution.name, verdict.reason)
