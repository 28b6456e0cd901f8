"""A small dataset for the service's tests: the bundled rmsnorm_h4096 (its definition and its
two smallest workloads, copied: a hostile solution must find nothing of the repository's to
write), solutions to submit, and the service started on a free localhost port."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

from flashtune.data import Dataset, Definition, Solution, Workload
from flashtune.data.dataset import bundled_root

DEFINITION = "rmsnorm_h4096"

HONEST = """
import torch

def run(hidden_states, weight):
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    return (x * inv * weight.float()).to(hidden_states.dtype)
"""

# 10% off on every element: far outside bf16's bounds.
WRONG = """
import torch

def run(hidden_states, weight):
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    return (1.1 * x * inv * weight.float()).to(hidden_states.dtype)
"""

BROKEN = "def run(hidden_states, weight:\n    return hidden_states\n"


def hostile(token: str, token_file: Path, port: int, dataset: Path, out: Path) -> str:
    """A solution that tries to take what the service holds: its token (from the environment
    and from its file), its HTTP port, the dataset and the service's traces; it reports what
    it got in its error (RUNTIME_ERROR's log comes back through the service). It is given the
    token's SHA-256 (not the token) to recognise it in any environment value or file."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    return textwrap.dedent(
        f"""
        import hashlib, json, os, socket

        DIGEST = {digest!r}

        def _try(what):
            try:
                return what()
            except BaseException as exc:
                return "blocked: " + type(exc).__name__ + ": " + str(exc)[:80]

        def _connect():
            s = socket.create_connection(("127.0.0.1", {port}), timeout=3)
            s.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
            return "connected: " + s.recv(200).decode(errors="replace")

        def _write(path):
            with open(path, "w") as f:
                f.write("{{}}")
            return "written: " + path

        def run(hidden_states, weight):
            report = {{
                "token_in_environ": [
                    k for k, v in os.environ.items()
                    if any(hashlib.sha256(w.encode()).hexdigest() == DIGEST for w in [v, *v.split()])
                ],
                "environ_names": sorted(os.environ)[:40],
                "token_file": _try(lambda: "read: " + open({str(token_file)!r}).read()),
                "connect": _try(_connect),
                "write_dataset": _try(lambda: _write({str(dataset / "definitions" / "pwned.json")!r})),
                "write_traces": _try(lambda: _write({str(out / "pwned.jsonl")!r})),
            }}
            raise RuntimeError("HOSTILE-REPORT " + json.dumps(report) + " END-REPORT")
        """
    )


def solution(name: str, body: str, definition: str = DEFINITION) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition,
            "author": "agent",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu", "cuda"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": body}],
        }
    )


def small_dataset(root: Path, workloads: int = 1) -> Path:
    """rmsnorm_h4096 and its `workloads` smallest workloads, copied from the bundled dataset."""
    bundled = Dataset(bundled_root())
    definition = bundled.definition(DEFINITION)
    records = sorted(
        bundled.workloads_for(DEFINITION), key=lambda r: r.workload.axes.get("batch_size", 0)
    )
    ds = Dataset(root)
    ds.add_definition(definition)
    ds.add_workloads(definition, [r.workload for r in records[:workloads]])
    return root


def report_of(log: str) -> dict:
    """The hostile solution's report from its RUNTIME_ERROR log."""
    marker = (
        "RuntimeError: HOSTILE-REPORT "  # the raised error, not the source line quoted above it
    )
    start = log.rindex(marker) + len(marker)
    return json.loads(log[start : log.index(" END-REPORT", start)])


def tool_target(root: Path) -> tuple[Definition, Workload, Path]:
    """(definition, workload, dataset root) of small_dataset's first workload under `root`:
    what the sanitizer and Nsight tests run a solution on."""
    dataset = small_dataset(root)
    ds = Dataset(dataset)
    return ds.definition(DEFINITION), ds.workloads_for(DEFINITION)[0].workload, dataset
