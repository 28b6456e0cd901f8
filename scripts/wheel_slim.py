"""Write a copy of a wheel with some of its files left out, still a valid wheel.

Shared by scripts/slim_ray_wheel.py and scripts/slim_flashinfer_wheel.py: the `device` tool
carries at most 64 MiB to the GPU machine, so large wheels travel slimmed. The copy keeps the
kept members byte for byte (same names, same zip metadata) and rewrites the .dist-info/RECORD
so that it lists exactly the files kept, each with its sha256 and size (PEP 376 / 427).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def record_hash(data: bytes) -> str:
    """The RECORD hash field of `data`: sha256, urlsafe base64 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


@dataclass
class SlimResult:
    """What `write_filtered_wheel` wrote: the new wheel and the members it left out."""

    path: Path
    kept: list[str] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)  # (name, uncompressed size)


def record_name(names: list[str]) -> str:
    return next(n for n in names if n.endswith(".dist-info/RECORD"))


def write_filtered_wheel(wheel: Path, out_dir: Path, keep: Callable[[str], bool]) -> SlimResult:
    """Copy `wheel` into `out_dir` (same file name) with only the members `keep` accepts.

    The .dist-info/ files are always kept, RECORD rewritten last. A directory entry is kept
    only if `keep` accepts it (wheels rarely hold any)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise ValueError(f"{out} would overwrite its source")
    result = SlimResult(out)
    with zipfile.ZipFile(wheel) as src:
        record = record_name(src.namelist())
        dist_info = record.rsplit("/", 1)[0] + "/"
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
            lines = []
            for info in src.infolist():
                if info.filename == record:
                    continue
                if not info.filename.startswith(dist_info) and not keep(info.filename):
                    result.dropped.append((info.filename, info.file_size))
                    continue
                data = src.read(info)
                dst.writestr(info, data)
                result.kept.append(info.filename)
                if not info.is_dir():
                    lines.append(f"{info.filename},{record_hash(data)},{len(data)}")
            lines.append(f"{record},,")
            info = zipfile.ZipInfo(record, date_time=src.getinfo(record).date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, "\n".join(lines) + "\n")  # same bytes for the same input
    return result


def verify_record(wheel: Path) -> list[str]:
    """Problems with `wheel`'s RECORD: members missing from it, entries without a member,
    hashes or sizes that differ. Empty when the RECORD is right."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        record = record_name(names)
        entries = {}
        for line in zf.read(record).decode().splitlines():
            if line:
                name, digest, size = line.rsplit(",", 2)
                entries[name] = (digest, size)
        for name in names:
            if name not in entries:
                problems.append(f"not in RECORD: {name}")
            elif name != record:
                data = zf.read(name)
                if entries[name] != (record_hash(data), str(len(data))):
                    problems.append(f"hash or size differs: {name}")
        problems += [f"in RECORD, not in the wheel: {n}" for n in entries if n not in names]
    return problems
