"""Write a slim copy of a Ray wheel: Ray's core (actors, placement groups, the raylet and GCS
binaries), without what a `flashtune run --ray` / `tune --ray` never loads.

The `device` tool carries at most 64 MiB of ignored files to the GPU machine, which has no
network; Ray's wheel is about 80 MB, of which the Java jars, the dashboard's web client and
the libraries on top of the core (RLlib, Serve, Data, Train, Tune, LLM) are about 40 MB. The
copy stays a valid wheel: its RECORD lists exactly the files kept, with their hashes.

    python scripts/slim_ray_wheel.py ray-2.60.0-cp312-...whl .peer/ray/
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

# Prefixes inside the wheel that the cluster path of flashtune does not import.
DROP = (
    "ray/jars/",
    "ray/dashboard/client/",
    "ray/rllib/",
    "ray/serve/",
    "ray/data/",
    "ray/train/",
    "ray/tune/",
    "ray/llm/",
    "ray/air/examples/",
)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def slim(wheel: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name
    with (
        zipfile.ZipFile(wheel) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst,
    ):
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename == record_name or info.filename.startswith(DROP):
                continue
            data = src.read(info)
            dst.writestr(info, data)
            lines.append(f"{info.filename},{_record_hash(data)},{len(data)}")
        lines.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(lines) + "\n")
    return out


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    out = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
