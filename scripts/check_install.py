"""Prove that the README's install commands resolve on plain PyPI, as a new user's pip sees it.

CI machines (and ours) carry local wheels and pip settings a user does not have: a CPU build
of torch on disk, extra indexes, a cap on torch's version. A test command that installs here
can still be impossible elsewhere (it was: torch 2.13 from PyPI requires Triton 3.7.1 while
constraints.txt pinned 3.6.0). This script takes each `pip install` of the README's two
commands, exactly as written, and asks pip to resolve it in a fresh virtual environment with
every pip configuration file and PIP_* variable removed (so only PyPI is consulted) and with
`--dry-run`: pip downloads the metadata, installs nothing, and writes a report of what it
would install. It fails when a command cannot resolve, and prints the torch/Triton pair and
whether CUDA libraries would come with it.

    python scripts/check_install.py            # both commands
    python scripts/check_install.py --command 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_ATTEMPTS = 2  # one retry: a transient network error must not read as "cannot resolve"


def readme_commands(readme: str) -> dict[int, str]:
    """The README's numbered commands: the line after each `# N. ...` comment in its first
    bash block."""
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    if block is None:
        raise ValueError("README.md has no ```bash block")
    commands: dict[int, str] = {}
    lines = block.group(1).splitlines()
    for i, line in enumerate(lines):
        numbered = re.match(r"#\s*(\d+)\.", line.strip())
        if numbered and i + 1 < len(lines):
            commands[int(numbered.group(1))] = lines[i + 1].strip()
    return commands


def pip_installs(command: str) -> list[list[str]]:
    """The arguments of each `pip install` / `python -m pip install` in a `&&` chain."""
    steps = []
    for part in command.split("&&"):
        words = shlex.split(part)
        for start in range(len(words)):
            if words[start : start + 2] == ["pip", "install"]:
                steps.append(words[start + 2 :])
                break
    return steps


def plain_pypi_env() -> dict[str, str]:
    """This environment without pip's configuration: no config file, no PIP_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolve(args: list[str], python: str, cwd: Path) -> dict:
    """Resolve one `pip install` on plain PyPI with --dry-run; -> pip's installation report."""
    args = [a for a in args if a not in ("-q", "--quiet")]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        cmd += ["--report", str(report), *args]
        for attempt in range(_ATTEMPTS):
            done = subprocess.run(
                cmd, cwd=cwd, env=plain_pypi_env(), capture_output=True, text=True
            )
            if done.returncode == 0:
                return json.loads(report.read_text())
            if "ResolutionImpossible" in done.stderr or attempt + 1 == _ATTEMPTS:
                raise SystemExit(
                    f"cannot resolve on plain PyPI: pip install {shlex.join(args)}\n"
                    + done.stderr[-4000:]
                )
    raise AssertionError("unreachable")


def summarize(report: dict) -> str:
    installs = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    cuda = sorted(n for n in installs if n.startswith(("nvidia-", "cuda-")))
    pair = ", ".join(f"{n} {installs[n]}" for n in ("torch", "triton") if n in installs)
    return f"{len(installs)} packages ({pair or 'no torch/triton'}); " + (
        f"{len(cuda)} CUDA packages come with it" if cuda else "no CUDA packages"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", type=int, action="append", help="README command number")
    options = parser.parse_args()
    commands = readme_commands((ROOT / "README.md").read_text())
    wanted = options.command or sorted(commands)
    with tempfile.TemporaryDirectory() as tmp:
        # A fresh environment: nothing installed counts as already satisfied.
        venv.create(tmp, with_pip=True)
        python = str(Path(tmp) / "bin" / "python")
        for number in wanted:
            if number not in commands:
                raise SystemExit(f"README.md has no command {number}")
            for args in pip_installs(commands[number]):
                report = resolve(args, python, ROOT)
                print(f"README command {number}: pip install {shlex.join(args)}")
                print(f"  resolves on plain PyPI: {summarize(report)}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
