"""benchmarks/common.Selection: the pick made in one process is measured in another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


# ~4 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
@pytest.mark.slow
def test_selection_hands_its_picks_to_a_fresh_process(tmp_path):
    script = tmp_path / "bench_toy.py"
    report = tmp_path / "report.json"
    script.write_text(
        textwrap.dedent(
            f"""
            import argparse, json, os, sys
            sys.path.insert(0, {str(BENCHMARKS)!r})
            from common import Selection

            ap = argparse.ArgumentParser()
            ap.add_argument("--picks")
            ap.add_argument("--size", type=int)
            opts = ap.parse_args()
            sel = Selection(opts.picks, sweep=True)
            tactics = [(1, 2), (3, 4), (5, 6)]
            if sel.selecting:
                timings = {{t: 1.0 + abs(t[0] - opts.size) for t in tactics}}
                best = min(tactics, key=timings.get)
                sel.record(f"toy/{{opts.size}}", best, timings[best])
                with open({str(report)!r} + ".select", "w") as f:
                    json.dump({{"pid": os.getpid()}}, f)
                sel.measure_in_fresh_process(__file__)
            else:
                tactic, selection_ms = sel.lookup(f"toy/{{opts.size}}", tactics)
                with open({str(report)!r}, "w") as f:
                    json.dump({{"pid": os.getpid(), "tactic": tactic, "ms": selection_ms,
                               "size": opts.size}}, f)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS)}
    subprocess.run([sys.executable, str(script), "--size", "3"], check=True, env=env)
    selected = json.loads(Path(str(report) + ".select").read_text())
    measured = json.loads(report.read_text())
    assert measured["pid"] != selected["pid"]  # measured in another process
    assert measured["tactic"] == [3, 4]  # the pick, matched back to a live tactic
    assert measured["ms"] == 1.0 and measured["size"] == 3  # the same arguments
