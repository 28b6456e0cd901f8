"""Place FlashInfer-Bench's source at the commit the interop tests pin (CI's setup step).

    python scripts/fetch_flashinfer_bench.py                    # into $FLASHTUNE_FIB_HEAD
    python scripts/fetch_flashinfer_bench.py --from-git CLONE   # offline, from a local clone
    python scripts/fetch_flashinfer_bench.py --print-path       # where it is (for PYTHONPATH)

flashtune's interop tests run twice: against the FlashInfer-Bench release installed from the
package index (0.1.2) and against its current source, pinned here (COMMIT). The source is the
repository's own archive of that commit (GitHub serves it; no package index is involved),
unpacked into FLASHTUNE_FIB_HEAD (default ../shared/flashinfer-bench-head), keeping only the
`flashinfer_bench/` package and its licence. What was unpacked is checked against SOURCE_SHA256,
a digest of the package's files by path and content (not of the archive, whose compression
GitHub may change), so a moved tag, a different commit or a tampered download fails here, not
as a puzzling test failure. Why not vendored: its data layer imports most of the package
(560 KB, Apache-2.0) and follows upstream weekly; a pinned archive is one line to move.
Why not `pip install git+...`: its dependencies would be resolved anew (tvm-ffi, cuda
wheels); the tests need its Python source only, importing it with PYTHONPATH and a stand-in
for the one GPU-only import (tests/interop/stubs/: flashinfer.testing's CUPTI timer).

To move the pin: set COMMIT, run with --from-git on a clone that has it and --update-digest,
commit the new SOURCE_SHA256 with the interop tests it makes pass.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

REPOSITORY = "flashinfer-ai/flashinfer-bench"
COMMIT = "40e6ca7844b514eb4b1c7edba6d6a7377df57870"  # main, 2026-11 (#424)
SOURCE_SHA256 = "19667411c55087b8d2ab7847c94ed88964186021d4a524ff9d9696c31e5af3d5"
ARCHIVE_URL = f"https://codeload.github.com/{REPOSITORY}/tar.gz/{COMMIT}"
KEPT = ("flashinfer_bench/", "LICENCE", "NOTICE")
MARKER = ".flashinfer-bench-commit"  # the commit the folder holds, written last


def default_destination() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from flashtune import env

    path = env.FIB_HEAD.get()
    root = Path(__file__).resolve().parents[1]
    return path if path.is_absolute() else (root / path).resolve()


def source_digest(root: Path) -> str:
    """SHA-256 over `flashinfer_bench/**` files: each one's relative path and content."""
    digest = hashlib.sha256()
    for path in sorted((root / "flashinfer_bench").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _archive_from_git(clone: Path) -> bytes:
    return subprocess.run(
        ["git", "-C", str(clone), "archive", "--format=tar", COMMIT],
        check=True,
        capture_output=True,
    ).stdout


def _archive_from_github() -> bytes:
    with urllib.request.urlopen(ARCHIVE_URL, timeout=120) as response:  # noqa: S310 - fixed URL
        return response.read()


def _unpack(archive: bytes, into: Path) -> None:
    """Extract the KEPT members (a GitHub tarball has a top folder; `git archive` does not)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            relative = (
                "/".join(parts[1:]) if parts[0].startswith("flashinfer-bench-") else member.name
            )
            if not member.isfile() or not relative.startswith(KEPT):
                continue
            target = into / relative
            if not target.resolve().is_relative_to(into.resolve()):
                raise SystemExit(f"archive member {member.name!r} leads outside {into}")
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="default: $FLASHTUNE_FIB_HEAD")
    parser.add_argument("--from-git", type=Path, help="a local clone holding the commit")
    parser.add_argument("--print-path", action="store_true", help="print the folder and exit")
    parser.add_argument(
        "--update-digest", action="store_true", help="print the unpacked source's digest"
    )
    args = parser.parse_args(argv)
    dest = (args.dest or default_destination()).resolve()
    if args.print_path:
        print(dest)
        return 0
    if (dest / MARKER).is_file() and (dest / MARKER).read_text().strip() == COMMIT:
        if args.update_digest or source_digest(dest) == SOURCE_SHA256:
            print(f"{dest}: FlashInfer-Bench {COMMIT[:12]} already there")
            return 0
    archive = _archive_from_git(args.from_git) if args.from_git else _archive_from_github()
    with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.is_dir() else None) as tmp:
        staged = Path(tmp) / "src"
        _unpack(archive, staged)
        digest = source_digest(staged)
        if args.update_digest:
            print(f"SOURCE_SHA256 = {digest!r}")
        elif digest != SOURCE_SHA256:
            raise SystemExit(
                f"FlashInfer-Bench {COMMIT[:12]}: its source digests to {digest}, not the pinned "
                f"{SOURCE_SHA256}: refusing it"
            )
        (staged / MARKER).write_text(COMMIT + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), dest)
    print(f"{dest}: FlashInfer-Bench {COMMIT[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
