"""Issue 19's loop on the tiny model, on CPU (flashtune's kernels in the Triton interpreter):
capture -> benchmark the captured workloads -> enable_apply -> generate again. On CPU the
flashtune (Triton, cuda-only) and FlashInfer solutions are SKIPPED and torch's run, so the
winners are torch's; the structure is the GPU run's. The tiny model's norms use eps=1e-6,
which the candidates (hard-coding 1e-5) do not compute: those ops get none and run
themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.cli.e2e import run_loop
from flashtune.models import TINY, Llama
from flashtune.models.loop import format_report


# The whole loop: a benchmark of every captured workload (41 triples, 30-45 s on two
# cores). CI's slow step runs it; the main suite keeps apply's own capture -> bench ->
# apply loop (tests/apply/test_end_to_end.py).
@pytest.mark.slow
def test_capture_run_apply_keeps_the_outputs(tmp_path: Path) -> None:
    model = Llama(TINY, "flashtune", device="cpu", dtype=torch.float16, page_size=4, num_pages=32)
    report = run_loop(
        model, tmp_path / "ds", ["cpu"], prompt_lens=(5, 9, 3), decode_steps=2, rounds=2
    )
    # Every hot op of the model is visible to capture.
    families = {"gemm_", "rmsnorm_", "fused_add_rmsnorm_", "silu_and_mul_", "rope_"}
    families |= {"gqa_paged_decode_", "gqa_paged_prefill_causal_"}
    for family in families:
        assert any(name.startswith(family) for name in report.captured), family
    # Candidates were traced: torch's pass on CPU, the cuda-only ones are skipped.
    assert report.statuses.get("PASSED", 0) > 0
    assert set(report.statuses) <= {"PASSED", "SKIPPED"}
    assert set(report.winners) == set(report.captured)
    # Every op got a solution (silu_and_mul included: its output-only hidden_size axis is
    # derived from the schema's constraint, so its captured workloads are valid), but the
    # norms: the candidates hard-code eps=1e-5, the tiny model's is 1e-6.
    norms = {n for n in report.captured if "rmsnorm" in n}
    assert norms and set(report.no_candidates) == norms
    assert all("eps=1e-05" in why for why in report.no_candidates.values())
    assert all(report.winners[n] is None for n in norms)
    others = [w for n, w in report.winners.items() if n not in norms]
    assert others and all(w is not None and w.startswith("torch@") for w in others)
    # Apply changed who runs the ops, not what the model computes.
    assert report.same_tokens and report.greedy_agreement == 1.0
    assert report.logits_max_abs_err <= 2e-2
    assert report.outputs_match and report.logits_max_rel_err <= 1e-2
    assert report.before_ms > 0 and report.after_ms > 0
    # The graph-replayed step (what serving runs) is timed on a GPU only, and says so.
    assert report.before_graph_ms is None and report.after_graph_ms is None
    assert report.graph_note == "no CUDA graphs off a GPU"
    assert "CUDA-graph replay): not timed (no CUDA graphs off a GPU)" in format_report(report)


@pytest.mark.slow
def test_the_documented_command_runs_the_loop_on_cpu(tmp_path: Path) -> None:
    argv = ["e2e", "--loop", "--config", "tiny", "--device", "cpu", "--dtype", "float16"]
    result = CliRunner().invoke(app, [*argv, "--dataset", str(tmp_path), "--decode-steps", "2"])
    assert result.exit_code == 0, result.output
    assert "outputs (same tokens fed to both runs): match" in result.output
    assert "eps=1e-05, the model's eps=1e-06: the op runs itself" in result.output


@pytest.mark.slow
def test_the_loop_runs_the_deepseek_stack(tmp_path: Path) -> None:
    """The MLA model's calls go through the same loop: its MLA decode and non-absorbed
    ragged prefill are captured, get candidates, and apply keeps what the model computes
    (apply's MLA result adapter returns (output, lse) only when the call asks for it)."""
    from flashtune.models.loop import loop_model

    model, prompts = loop_model("deepseek-tiny", device="cpu", dtype="float16")
    report = run_loop(model, tmp_path / "ds", ["cpu"], prompt_lens=prompts, decode_steps=2)
    mla = [n for n in report.captured if n.startswith(("mla_paged_decode_", "mla_ragged_"))]
    assert len(mla) == 2, report.captured
    assert all(report.winners[n] and report.winners[n].startswith("torch@") for n in mla)
    # GPT-J-style RoPE has no bundled candidates: said, and the op runs itself.
    rope = [n for n in report.captured if n.startswith("rope_")]
    assert rope and all("no op family bundles" in report.no_candidates[n] for n in rope)
    assert report.same_tokens and report.outputs_match
    assert report.logits_max_rel_err <= 1e-2
