"""The OS-level sandbox (bench/isolation.py): escapes planted as real solutions, run beside an
honest one in one run on the CPU. None may do damage, and the honest solution, run after
them, keeps PASSED. Where the platform lacks a layer the tests that need it skip, saying
which; separate tests check that the report and `flashtune run`'s summary say so.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from _bench_helpers import make_dataset, processes_running, statuses
from rich.console import Console

import flashtune
from flashtune.bench import confine, isolation, sandbox
from flashtune.bench.evaluate import BenchConfig
from flashtune.bench.runner import RunOptions, RunResult, run_benchmark

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux only")

HONEST = "def run(x, w):\n    return x * w\n"
CFG = BenchConfig(warmup=1, iterations=5, trials=1, input_sets=2, first_call_timeout=60.0)


def _in_child(scratch: Path, then: str = "") -> dict[str, Any]:
    """enter_sandbox in a forked child (it inherits this process's monkeypatches), with
    `scratch` as its scratch folder, then the statements `then` (which may set `result`);
    -> {"report": ..., "result": ...}."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        out: dict[str, Any] = {}
        try:
            out["report"] = isolation.enter_sandbox(scratch, ())
            scope: dict[str, Any] = {"result": None}
            exec(then, scope)
            out["result"] = scope["result"]
        except BaseException as exc:  # noqa: BLE001
            out["error"] = repr(exc)
        os.write(write, json.dumps(out, default=str).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    got = json.loads(data)
    assert "error" not in got, got["error"]
    return got


@pytest.fixture(scope="module")
def platform_report(tmp_path_factory) -> dict[str, Any]:
    """What a sandbox gets on this machine."""
    return _in_child(tmp_path_factory.mktemp("probe"))["report"]


def _needs(report: dict[str, Any], **wanted: Any) -> None:
    for key, value in wanted.items():
        got = report.get(key)
        ok = (
            got >= value if isinstance(value, int) and not isinstance(value, bool) else got == value
        )
        if not ok:
            pytest.skip(f"this platform's sandbox has {key}={got!r} (needs {value!r})")


# --------------------------------------------------------------------------- the attacks

PRELUDE = """
import os, signal, socket, sys
def _try(name, fn):
    try:
        fn()
    except Exception as exc:
        print(f"ATTACK {name}: blocked ({type(exc).__name__}: {exc})", flush=True)
    else:
        print(f"ATTACK {name}: ESCAPED", flush=True)
def _ancestors():
    pids, pid = [], os.getppid()
    while pid > 1:
        pids.append(pid)
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        pid = int(text[text.rfind(")") + 2 :].split()[1])
    return pids
"""
TAIL = "\ndef run(x, w):\n    return x * w\n"

# A helper that outlives its sandbox: double fork, new session, exec.
_HELPER = """
def _helper():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{marker}"])
        os._exit(0)
_helper()
"""

ATTACKS = {
    # The worker is the fork server's parent: write its memory.
    "a_proc_mem": """
for pid in _ancestors():
    _try(f"proc_mem {pid}", lambda: open(f"/proc/{pid}/mem", "r+b"))
""",
    # Plant code in flashtune's installed sources (a restarted worker would import it).
    "b_source": """
src = os.path.dirname(flashtune_init)
_try("source_new", lambda: open(os.path.join(src, "evil_{marker}.py"), "w"))
_try("source_edit", lambda: open(os.path.join(src, "__init__.py"), "a"))
""",
    # Forge and rewrite traces in --out.
    "c_out": """
traces = os.path.join(OUT, "traces", "tests", "toy")
for name in ("old.jsonl", "toy_scale_h8.jsonl"):  # an earlier run's, this run's
    _try(f"out_edit {name}", lambda: open(os.path.join(traces, name), "a").write("FORGED"))
_try("out_list", lambda: os.listdir(OUT))
_try("out_new", lambda: open(os.path.join(OUT, "forged_{marker}.jsonl"), "w"))
""",
    # Change the dataset's definitions (its reference) and workloads.
    "d_dataset": """
for folder, _, files in os.walk(DATASET):
    for name in files:
        _try(f"dataset_edit {name}", lambda: open(os.path.join(folder, name), "a").write("X"))
_try("dataset_new", lambda: open(os.path.join(DATASET, "evil_{marker}"), "w"))
""",
    # Poison the shared build cache, read the signing key.
    "e_cache": """
_try("key_read", lambda: print("KEY=" + open(KEY).read()))
_try("cache_list", lambda: os.listdir(CACHE))
_try("cache_new", lambda: open(os.path.join(CACHE, "evil_{marker}"), "w"))
def _poison():
    with open(os.path.join(CACHE, "build", "victim", "lib.so"), "w") as f:
        f.write("POISON")
_try("build_poison", _poison)
""",
    # Stop or kill the harness: the fork server, the worker, the runner.
    "f_signals": """
for pid in _ancestors():
    def _signal(pid=pid):
        os.kill(pid, 0)  # only a probe: a real SIGSTOP would hang this test if it got through
        os.kill(pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGCONT)
    _try(f"signal {pid}", _signal)
""",
    # The helper above, left running when the sandbox ends cleanly.
    "g_helper": _HELPER,
    # The same, then the sandbox dies at once (its helper is orphaned to the worker).
    "h_helper_orphan": _HELPER + "os._exit(0)\n",
    # The network, and the fork server's unix socket (it forks an unsandboxed process for
    # whoever connects).
    "i_sockets": """
_try("tcp", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2))
_try("forkserver", lambda: socket.socket(socket.AF_UNIX).connect(FORKSERVER))
""",
}


def _solution(name: str, body: str, values: dict[str, Any]) -> str:
    constants = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    return PRELUDE + constants + body.replace("{marker}", values["MARKER"]) + TAIL


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def attack_run(tmp_path_factory, platform_report):
    """One run: every attack the platform can stop, then the honest solution."""
    tmp = tmp_path_factory.mktemp("isolation")
    root, out = tmp / "ds", tmp / "out"
    cache = Path(os.environ["FLASHTUNE_CACHE_DIR"])
    key = cache / "apply" / "table.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    secret = f"secret-{random.randrange(10**12)}"
    key.write_text(secret)
    victim = cache / "build" / "victim" / "lib.so"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("original")
    old_trace = out / "traces" / "tests" / "toy" / "old.jsonl"
    old_trace.parent.mkdir(parents=True)
    old_trace.write_text('{"old": true}\n')
    sandbox.forkserver_context()  # this process's fork server (it forks the workers)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    marker = f"{9000 + os.getpid() % 1000}.{random.randrange(10**6):06d}"
    values = {
        "MARKER": marker,
        "OUT": str(out),
        "DATASET": str(root),
        "CACHE": str(cache),
        "KEY": str(key),
        "PORT": listener.getsockname()[1],
        "FORKSERVER": multiprocessing.forkserver._forkserver._forkserver_address,
        "flashtune_init": flashtune.__file__,
    }
    # An attack runs only where the platform stops it (else it would do real damage here).
    has_fs = platform_report["fs"] == "scratch-only"
    wanted = {
        "a_proc_mem": True,
        "b_source": has_fs,
        "c_out": has_fs,
        "d_dataset": has_fs,
        "e_cache": has_fs,
        "f_signals": True,  # probes with signal 0 before anything else
        "g_helper": True,
        "h_helper_orphan": True,
        "i_sockets": True,
    }
    solutions = {n: _solution(n, b, values) for n, b in ATTACKS.items() if wanted[n]}
    solutions["z_honest"] = HONEST
    make_dataset(root, solutions, sizes=[64])
    before = {"dataset": _snapshot(root), "old_trace": old_trace.read_text()}
    opts = RunOptions(datasets=[root], out=out, devices=["cpu"], config=CFG, timeout=60.0)
    result = run_benchmark(opts, progress=False)
    try:
        accepted = listener.accept()[0]
        accepted.close()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    logs = {t.solution: t.evaluation.log for t in result.traces}
    yield {
        "result": result,
        "opts": opts,
        "logs": logs,
        "statuses": statuses(result.traces),
        "before": before,
        "root": root,
        "out": out,
        "cache": cache,
        "secret": secret,
        "victim": victim,
        "old_trace": old_trace,
        "marker": marker,
        "connected": connected,
    }
    for path in Path(flashtune.__file__).parent.glob(f"evil_{marker}.py"):
        path.unlink()  # only there if the sandbox failed


def _attacks(run: dict[str, Any], solution: str) -> dict[str, str]:
    """'ATTACK name: outcome' lines of a solution's log."""
    lines = [x for x in run["logs"][solution].splitlines() if x.startswith("ATTACK ")]
    return dict(line.removeprefix("ATTACK ").split(": ", 1) for line in lines)


def test_the_honest_solution_after_the_attacks_passes(attack_run):
    assert attack_run["statuses"][("toy_scale_h8", "z_honest")] == "PASSED", attack_run["logs"]


def test_the_worker_memory_cannot_be_written(attack_run):
    got = _attacks(attack_run, "a_proc_mem")
    assert got and all(v.startswith("blocked") for v in got.values()), got


def test_flashtune_sources_cannot_be_changed(attack_run, platform_report):
    _needs(platform_report, fs="scratch-only")
    got = _attacks(attack_run, "b_source")
    assert set(got) == {"source_new", "source_edit"}
    assert all(v.startswith("blocked") for v in got.values()), got
    assert not list(Path(flashtune.__file__).parent.glob("evil_*.py"))


def test_traces_in_out_cannot_be_forged(attack_run, platform_report):
    _needs(platform_report, fs="scratch-only")
    got = _attacks(attack_run, "c_out")
    assert len(got) == 4 and all(v.startswith("blocked") for v in got.values()), got
    assert attack_run["old_trace"].read_text() == attack_run["before"]["old_trace"]
    out = attack_run["out"]
    for path in out.rglob("*"):
        assert "forged" not in path.name
        # solutions/: the run's copy of the attacking solution (bench/export.py), whose source
        # spells the word; what it wrote would be anywhere else.
        if path.is_file() and path.relative_to(out).parts[0] != "solutions":
            assert "FORGED" not in path.read_text()


def test_the_dataset_cannot_be_changed(attack_run, platform_report):
    _needs(platform_report, fs="scratch-only")
    got = _attacks(attack_run, "d_dataset")
    assert any(k.startswith("dataset_edit") for k in got), got  # it could list the dataset
    assert all(v.startswith("blocked") for v in got.values()), got
    assert _snapshot(attack_run["root"]) == attack_run["before"]["dataset"]


def test_the_cache_folder_and_its_keys_are_out_of_reach(attack_run, platform_report):
    _needs(platform_report, fs="scratch-only")
    got = _attacks(attack_run, "e_cache")
    for name in ("key_read", "cache_list", "cache_new"):
        assert got[name].startswith("blocked"), got
    # With a mount namespace the shared build cache is an overlay: the write lands in the
    # sandbox's own scratch; without one the folder is out of reach. The shared file is
    # unchanged either way.
    assert attack_run["victim"].read_text() == "original"
    assert not list(attack_run["cache"].glob("evil_*"))
    assert all(attack_run["secret"] not in log for log in attack_run["logs"].values())


def test_the_harness_cannot_be_signalled(attack_run, platform_report):
    _needs(platform_report, signals="scoped")
    got = _attacks(attack_run, "f_signals")
    assert len(got) >= 3, got  # the fork server, the worker, the runner (at least)
    assert all(v.startswith("blocked") for v in got.values()), got


def test_no_helper_outlives_the_run(attack_run):
    assert attack_run["statuses"][("toy_scale_h8", "h_helper_orphan")] == "RUNTIME_ERROR"
    deadline = time.monotonic() + 5
    while processes_running(attack_run["marker"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_running(attack_run["marker"]) == []


def test_no_network_and_no_fork_server(attack_run, platform_report):
    got = _attacks(attack_run, "i_sockets")
    if platform_report["network"] != "open":
        assert got["tcp"].startswith("blocked"), got
        assert not attack_run["connected"]
    _needs(platform_report, unix_sockets="no connect")
    assert got["forkserver"].startswith("blocked"), got


def test_every_trace_and_the_summary_state_the_isolation(attack_run):
    result: RunResult = attack_run["result"]
    report = result.environment["sandbox"]
    assert all(t.evaluation.environment["sandbox"] == report for t in result.traces)
    console = Console(record=True, width=200)
    from flashtune.cli.run_checks import print_closing

    print_closing(result, attack_run["opts"], attack_run["out"], console)
    line = next(x for x in console.export_text().splitlines() if x.startswith("sandbox: "))
    assert line == isolation.describe(report)
    if isolation.isolated(report):
        assert f"Landlock ABI {report['landlock_abi']}" in line and "PARTIAL" not in line


# --------------------------------------------------------------------------- missing layers


def _no_layers(monkeypatch: pytest.MonkeyPatch, *layers: str) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise OSError(1, "Operation not permitted (simulated)")

    if "landlock" in layers:
        monkeypatch.setattr(confine, "landlock_abi", lambda: 0)
    if "userns" in layers:
        monkeypatch.setattr(confine, "enter_user_namespace", refuse)
        monkeypatch.setattr(confine, "enter_network_namespace", refuse)
    if "seccomp" in layers:
        monkeypatch.setattr(confine, "install_seccomp", refuse)


def test_without_landlock_or_namespaces_the_report_and_summary_say_so(monkeypatch, tmp_path):
    _no_layers(monkeypatch, "landlock", "userns")
    report = _in_child(tmp_path)["report"]
    assert report["enabled"] and report["landlock_abi"] == 0 and not report["userns"]
    assert report["fs"] == "unrestricted" and report["signals"] == "not scoped"
    assert any(m.startswith("Landlock") for m in report["missing"])
    line = isolation.describe(report)
    assert line.startswith("sandbox: NOT ISOLATED (no Landlock, no user namespaces)"), line
    assert not isolation.isolated(report)
    result = RunResult([], tmp_path, 0.0, 0, 0, [], {"sandbox": report})
    console = Console(record=True, width=300)
    from flashtune.cli.run_checks import print_closing

    print_closing(result, RunOptions(datasets=[], out=tmp_path), tmp_path, console)
    assert line in console.export_text()


def test_without_seccomp_unix_sockets_are_reported_reachable(monkeypatch, tmp_path):
    _no_layers(monkeypatch, "seccomp")
    report = _in_child(tmp_path)["report"]
    assert report["unix_sockets"] == "reachable" and not report["seccomp"]
    assert "PARTIAL" in isolation.describe(report) or report["landlock_abi"] == 0
    assert any("seccomp" in m for m in report["missing"])


def test_sandbox_off_is_stated_loudly(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHTUNE_SANDBOX", "0")
    got = _in_child(
        tmp_path, "import socket\nsocket.socket(socket.AF_UNIX).close()\nresult = 'made'"
    )
    assert got["report"]["enabled"] is False and got["result"] == "made"
    assert isolation.describe(got["report"]).startswith("sandbox: DISABLED by FLASHTUNE_SANDBOX=0")


def test_a_sandbox_weaker_than_the_probe_is_not_used(monkeypatch, platform_report):
    monkeypatch.setattr(sandbox, "_EXPECTED", {**platform_report, "landlock_abi": 99})
    box = sandbox.open_sandbox({"solution": "{}", "device": "cpu", "config": {}, "roots": ()})
    try:
        assert box.broken is not None and "landlock_abi" in box.broken
        with pytest.raises(sandbox.SandboxDied, match="less isolated"):
            box.start(None)  # type: ignore[arg-type]
    finally:
        box.close()
    assert not os.path.exists(box.spec.scratch)  # the scratch goes with the sandbox


def test_a_sys_path_entry_holding_the_cache_is_not_readable(monkeypatch, tmp_path, platform_report):
    _needs(platform_report, reads="allow-list")
    cache = tmp_path / "cache"
    (cache / "keys").mkdir(parents=True)
    (cache / "keys" / "runs.key").write_text("secret")
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(cache))
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the current folder
    probe = f"try:\n    open({str(cache / 'keys' / 'runs.key')!r}).read()\n    result = 'read'\n"
    probe += "except OSError as exc:\n    result = repr(exc)\n"
    got = _in_child(tmp_path / "scratch", probe)
    assert got["result"].startswith("PermissionError"), got


# --------------------------------------------------------------------------- pieces


def test_the_seccomp_filter_jumps_stay_in_the_program():
    for machine in ("x86_64", "aarch64"):
        for deny_ip in (False, True):
            program = confine.seccomp_program(machine, deny_ip)
            assert program is not None
            for index, (code, jt, jf, _) in enumerate(program):
                if code == 0x15 or code == 0x35:  # conditional jumps
                    assert index + 1 + max(jt, jf) < len(program)
            assert program[-2:] == [(0x06, 0, 0, 0x00050002), (0x06, 0, 0, 0x00050001)]
    assert confine.seccomp_program("sparc", False) is None


def test_triton_reads_the_shared_cache_and_writes_its_own(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from flashtune.bench.triton_cache import LayeredCacheManager

    shared, own = tmp_path / "shared", tmp_path / "own"
    (shared / "KEY").mkdir(parents=True)
    (shared / "KEY" / "k.cubin").write_bytes(b"warm")
    outside = tmp_path / "elsewhere.so"
    outside.write_bytes(b"planted")
    group = {"child_paths": {"k.cubin": str(shared / "KEY" / "k.cubin")}}
    (shared / "KEY" / "__grp__k.json").write_text(json.dumps(group))
    bad = {"child_paths": {"k.so": str(outside)}}
    (shared / "KEY" / "__grp__bad.json").write_text(json.dumps(bad))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(own))
    monkeypatch.setenv(isolation.TRITON_SHARED_ENV, str(shared))
    cache = LayeredCacheManager("KEY")
    assert cache.get_file("k.cubin") == str(shared / "KEY" / "k.cubin")
    assert cache.get_group("k.json") == {"k.cubin": str(shared / "KEY" / "k.cubin")}
    assert cache.get_group("bad.json") is None  # a group naming a file elsewhere
    written = cache.put(b"cold", "new.cubin")
    assert written.startswith(str(own)) and not (shared / "KEY" / "new.cubin").exists()
    assert cache.get_file("new.cubin") == written


def test_temporary_files_land_in_the_scratch(tmp_path):
    """tempfile keeps the folder it chose first: in a GPU run the fork server had chosen /tmp,
    where a sandbox may not write, and Triton's compiles failed (PermissionError). Inside the
    sandbox it must choose the scratch, whatever the process chose before."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes a sandbox; the test process stays as it is
        try:
            import tempfile

            tempfile.tempdir = "/tmp"  # what the fork server had cached
            isolation.enter_sandbox(scratch)
            with tempfile.NamedTemporaryFile() as f:
                f.write(b"ok")
                os.write(write, f.name.encode())
        finally:
            os._exit(0)
    os.close(write)
    name = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    assert name.startswith(str(scratch)), name
