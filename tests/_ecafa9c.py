"""The 156 FlashInfer-Trace definitions of flashinfer-bench at ecafa9c (tests/dataset/data/,
see its README): their files, and a dataset root holding them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

ECAFA9C = (
    Path(__file__).resolve().parent
    / "dataset"
    / "data"
    / ("flashinfer_trace_ecafa9c_definitions.json.gz")
)


def ecafa9c_files() -> dict[str, str]:
    """{path under flashinfer_trace/definitions/: file text} of the ecafa9c definitions."""
    return json.loads(gzip.decompress(ECAFA9C.read_bytes()))


def write_ecafa9c(root: Path) -> Path:
    """`root`/definitions/<op_type>/<name>.json for each of them; returns `root`."""
    for relative, text in ecafa9c_files().items():
        path = root / "definitions" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
