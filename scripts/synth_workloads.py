"""Write synthesized workloads for the definitions of a dataset that have none.

The FlashInfer-Trace definitions this repository carries (tests/_ecafa9c.py) come without
their workloads, so `flashtune run` on them has nothing to run. This writes, for each
definition with no workload, one workload per `--sizes` entry: every var axis set from the
size the way `flashtune.data.small_workload` does (its constraints applied, inputs random),
as `<root>/workloads/<op_type>/<definition>.jsonl`. The inputs are then drawn by the run
(seeded), so these check a solution at the definition's real constant shapes, small var axes.

    python scripts/synth_workloads.py DATASET [--sizes 1,7,64] [--op-type mla_paged]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashtune.data import Dataset, small_workload
from flashtune.data.models import Trace
from flashtune.data.synth import listed_inputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--sizes", default="1,7,64", help="comma-separated var-axis sizes")
    parser.add_argument("--op-type", default=None, help="only definitions of this op_type")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        parser.error("--sizes: positive integers, e.g. 1,7,64")
    ds = Dataset(args.dataset)
    written = 0
    for definition in ds.definitions.values():
        if args.op_type and definition.op_type != args.op_type:
            continue
        if ds.workloads_for(definition.name):
            continue
        lines = []
        for size in sizes:
            workload = small_workload(definition, size).model_copy(
                update={"uuid": f"synth-{definition.name}-{size}"}
            )
            trace = Trace(definition=definition.name, workload=listed_inputs(definition, workload))
            lines.append(trace.model_dump_json(exclude_none=True))
        path = args.dataset / "workloads" / definition.op_type / f"{definition.name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        written += 1
    print(f"wrote workloads for {written} definition(s) under {args.dataset / 'workloads'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
