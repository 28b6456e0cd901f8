"""Name the commit measured in result rows whose "commit" the GPU call got wrong or left out.

A row's "code.files" is `flashtune.platform.files_hash` of the flashtune sources that ran,
computed on the GPU machine. This finds, among the last --depth commits, the one whose
src/flashtune reproduces that hash, and writes it into the rows' "commit" and "code.commit"
(with "code.source": "files-matched"; the newest such commit: the sources are the same
from the oldest to it). A row whose named commit reproduces its hash is kept; rows no
commit reproduces are left as they are and counted. Nothing is typed by hand: the commit comes from the hash.

    python scripts/pin_rows_commit.py benchmarks/results/fi072_decode.jsonl [--depth 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from flashtune.platform import files_hash


def commit_hashes(depth: int) -> dict[str, list[str]]:
    """{files_hash of src/flashtune at commit: its commits, newest first} for the last
    `depth` commits."""
    found: dict[str, list[str]] = {}
    revs = subprocess.check_output(["git", "rev-list", f"-{depth}", "HEAD"], text=True).split()
    for rev in revs:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "archive", rev, "src/flashtune"], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            found.setdefault(files_hash(Path(tmp) / "src" / "flashtune"), []).append(rev[:7])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--depth", type=int, default=40)
    args = parser.parse_args(argv)
    by_hash = commit_hashes(args.depth)
    unmatched = 0
    for path in args.files:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            commits = by_hash.get((row.get("code") or {}).get("files", ""), [])
            if not commits:
                unmatched += 1
                continue
            if any(str(row.get("commit", "")).startswith(c) for c in commits):
                continue  # the commit named on the GPU machine reproduces the hash: kept
            commit, named = commits[0], str(row.get("commit", ""))
            row["commit"] = commit
            row["code"].update(commit=commit, source="files-matched")
            # A headline lists the runs it summarises by the commit they named: the same fix.
            for run in row.get("runs") or ():
                if named and str(run.get("commit", "")) == named:
                    run["commit"] = commit
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{unmatched} row(s) matched no commit of the last {args.depth}")
    return 1 if unmatched else 0


if __name__ == "__main__":
    sys.exit(main())
