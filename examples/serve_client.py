"""Submit a solution to `flashtune serve`, poll its task and print the verdict.

    flashtune serve --devices cpu &                    # writes its token on first start
    python examples/serve_client.py                    # an honest rmsnorm_h4096
    python examples/serve_client.py --wrong            # a wrong one: INCORRECT_NUMERICAL

Options: --url (default http://127.0.0.1:8000), --token-file (default: the one `flashtune
serve` made, FLASHTUNE_CACHE_DIR/serve/token), --solution FILE (a Solution JSON instead of
the built-in rmsnorm). Exit status 0 when the verdict is PASSED.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flashtune.data import Solution
from flashtune.serve.auth import default_token_file
from flashtune.serve.client import TERMINAL_STATES, ServeClient

RMSNORM = """
import torch

def run(hidden_states, weight):
    x = hidden_states.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    return (x * inv * weight.float() * SCALE).to(hidden_states.dtype)
"""


def builtin_solution(wrong: bool) -> Solution:
    source = RMSNORM.replace("SCALE", "1.1" if wrong else "1.0")
    return Solution.model_validate(
        {
            "name": f"example-rmsnorm-{'wrong' if wrong else 'honest'}-{int(time.time())}",
            "definition": "rmsnorm_h4096",
            "author": "example",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu", "cuda"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token-file", type=Path, default=None)
    parser.add_argument("--solution", type=Path, default=None, help="a Solution JSON file")
    parser.add_argument("--wrong", action="store_true", help="submit the wrong built-in one")
    args = parser.parse_args()

    token = (args.token_file or default_token_file()).read_text(encoding="utf-8").strip()
    if args.solution is not None:
        solution = Solution.model_validate_json(args.solution.read_text(encoding="utf-8"))
    else:
        solution = builtin_solution(args.wrong)

    with ServeClient(args.url, token=token) as client:
        print(f"service: {client.health()['status']}, devices {client.health()['devices']}")
        task = client.submit(solution)
        print(f"submitted {solution.name} for {solution.definition}: task {task['task_id']}")
        while task["state"] not in TERMINAL_STATES:
            task = client.task(task["task_id"], wait=10)  # a long poll: returns when done
            print(f"  {task['state']}")
    if task["state"] != "done":
        print(f"{task['state']}: {task.get('error')}")
        return 1
    print(f"verdict: {task['verdict']}")
    for trace in task["traces"]:
        evaluation = trace["evaluation"]
        latency = (evaluation.get("performance") or {}).get("latency_ms")
        where = trace["workload"]["axes"]
        print(f"  {where}: {evaluation['status']}", f"{latency:.4f} ms" if latency else "")
    return 0 if task["verdict"] == "PASSED" else 1


if __name__ == "__main__":
    sys.exit(main())
