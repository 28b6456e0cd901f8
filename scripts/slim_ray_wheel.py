"""Write a slim copy of a Ray wheel: Ray's core (actors, placement groups, the raylet and GCS
binaries), without what a `flashtune run --ray` / `tune --ray` never loads.

The `device` tool carries at most 64 MiB of ignored files to the GPU machine, which has no
network; Ray's wheel is about 80 MB, of which the Java jars, the dashboard's web client and
the libraries on top of the core (RLlib, Serve, Data, Train, Tune, LLM) are about 40 MB. The
copy stays a valid wheel: its RECORD lists exactly the files kept, with their hashes.

    python scripts/slim_ray_wheel.py ray-2.60.0-cp312-...whl .peer/ray/
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheel_slim import write_filtered_wheel  # noqa: E402  (a sibling script, not a package)

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


def slim(wheel: Path, out_dir: Path) -> Path:
    return write_filtered_wheel(wheel, out_dir, lambda name: not name.startswith(DROP)).path


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    out = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
