"""The agent tools' parsers, on the CPU.

The sample outputs below are not captured from a GPU run: they were written for these tests
from the formats NVIDIA documents (the Compute Sanitizer user manual's memcheck, racecheck
and initcheck examples, in both the older "at kernel()+0x70 in file.cu:6" and the newer
"at 0x70 in /file.cu:6:kernel()" location styles; the Nsight Compute CLI's `--csv` output of
the details page, with ==PROF== lines and the target's own output before it, and of the raw
page, with its row of units). tests/serve/test_tools_cuda.py runs the real tools.
"""

from __future__ import annotations

import pytest

from flashtune.bench.nsight import parse_ncu_csv, summarize_kernels
from flashtune.bench.probe import parse_probe_line
from flashtune.bench.sanitizer import (
    SanitizeResult,
    combine_verdicts,
    parse_sanitizer_output,
)

MEMCHECK_OOB = """\
FLASHTUNE-PROBE {"ok": false, "stage": "call", "error": "RuntimeError: CUDA error"}
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at unaligned_kernel()+0x70 in memcheck_demo.cu:6
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f6510c00001 is misaligned
=========     and is inside the nearest allocation at 0x7f6510c00000 of size 4 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2774ec]
=========                in /lib/x86_64-linux-gnu/libcuda.so.1
=========
========= Invalid __global__ read of size 2 bytes
=========     at 0x1b0 in /tmp/kernels.py:14:_oob_copy_kernel
=========     by thread (127,0,0) in block (0,0,0)
=========     Address 0x7f6510c00200 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f6510c00000 of size 512 bytes
=========
========= Invalid __global__ write of size 16 bytes
=========     at 0x2c0 in _triton_store_kernel
=========     by thread (3,0,0) in block (7,0,0)
=========     Address 0x7f6510e00000 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 4 errors
"""

MEMCHECK_CLEAN = """\
========= COMPUTE-SANITIZER
FLASHTUNE-PROBE {"ok": true, "stage": "done", "sandbox": "Landlock ABI 7 + seccomp"}
========= ERROR SUMMARY: 0 errors
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at 0x00000110 in raceGroupBasedKernel(int *)
=========     and Read access at 0x00000130 in raceGroupBasedKernel(int *) [4 hazards]
=========
========= Warning: Race reported between Read access at 0x00000200 in reduce(float *)
=========     and Write access at 0x00000220 in reduce(float *) [1 hazard]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

RACECHECK_WARNINGS_ONLY = """\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at 0x00000200 in reduce(float *)
=========     and Write access at 0x00000220 in reduce(float *) [1 hazard]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""

INITCHECK = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at 0x70 in /home/user/initcheck_demo.cu:9:vectorAdd(int *)
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f5f8e000000
=========
========= ERROR SUMMARY: 1 error
"""

BROKEN_TOOL = """\
========= COMPUTE-SANITIZER
========= Error: Target application terminated before first instrumented API call
========= Tool execution finished with errors
"""


def test_memcheck_out_of_bounds_fails_and_names_the_kernels() -> None:
    report = parse_sanitizer_output(MEMCHECK_OOB, "memcheck")
    assert report.errors == 4
    assert report.verdict == "fail"
    kinds = [(f.kind, f.kernel, f.size) for f in report.findings]
    assert kinds == [
        ("misaligned", "unaligned_kernel()", 4),
        ("out_of_bounds", "_oob_copy_kernel", 2),
        ("out_of_bounds", "_triton_store_kernel", 16),
        ("api_error", None, None),
    ]


def test_clean_memcheck_passes() -> None:
    report = parse_sanitizer_output(MEMCHECK_CLEAN)
    assert (report.errors, report.findings, report.verdict) == (0, [], "pass")
    assert parse_probe_line(MEMCHECK_CLEAN) == {
        "ok": True,
        "stage": "done",
        "sandbox": "Landlock ABI 7 + seccomp",
    }


def test_racecheck_counts_errors_not_warnings() -> None:
    report = parse_sanitizer_output(RACECHECK, "racecheck")
    assert (report.errors, report.warnings, report.verdict) == (1, 1, "fail")
    assert [f.kernel for f in report.findings] == [
        "raceGroupBasedKernel(int *)",
        "reduce(float *)",
    ]
    only_warnings = parse_sanitizer_output(RACECHECK_WARNINGS_ONLY, "racecheck")
    assert (only_warnings.errors, only_warnings.verdict) == (0, "pass")


def test_initcheck_uninitialized_read_fails() -> None:
    report = parse_sanitizer_output(INITCHECK, "initcheck")
    assert report.verdict == "fail"
    assert [(f.kind, f.kernel, f.size) for f in report.findings] == [
        ("uninitialized", "vectorAdd(int *)", 4)
    ]


def test_a_tool_without_its_summary_is_an_error_never_a_pass() -> None:
    report = parse_sanitizer_output(BROKEN_TOOL)
    assert report.errors is None and report.verdict == "error"
    assert parse_sanitizer_output("").verdict == "error"


def test_combined_verdict_and_reason() -> None:
    assert combine_verdicts(["pass", "pass"]) == "pass"
    assert combine_verdicts(["pass", "unavailable"]) == "unavailable"
    assert combine_verdicts(["pass", "error", "fail"]) == "fail"
    assert combine_verdicts([]) == "unavailable"
    result = SanitizeResult("fail", "s", "d", "w", reports=[parse_sanitizer_output(MEMCHECK_OOB)])
    assert result.reason().startswith(
        "compute-sanitizer fail: memcheck: Invalid __global__ write of size 4 bytes in "
        "unaligned_kernel()"
    )
    assert result.to_json()["reports"][0]["verdict"] == "fail"


NCU_DETAILS = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "_rmsnorm_kernel" - 0: 0%....50%....100% - 9 passes
FLASHTUNE-PROBE {"ok": true, "stage": "done", "sandbox": "Landlock ABI 6"}
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","byte","16,793,600"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.peak_sustained","byte/cycle","1,024"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__cycles_elapsed.avg.per_second","cycle/nsecond","3.27"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","8,000"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","sm__cycles_elapsed.avg.per_second","cycle/second","1,755,000,000"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained","inst/cycle","16,896"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","inst","4,194,304"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","inst","4,194,304"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_fmul_pred_on.sum","inst","8,388,608"
"0","4242","python3.12","127.0.0.1","_rmsnorm_kernel","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_hfma_pred_on.sum","inst","n/a"
"1","4242","python3.12","127.0.0.1","elementwise_kernel","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"
"1","4242","python3.12","127.0.0.1","elementwise_kernel","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","Kbyte","64"
"""

NCU_RAW = """\
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes.sum","gpu__time_duration.sum"
"","","","","","","","","","","","Mbyte","usecond"
"0","99","python","host","gemm_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","2.0","1.0"
"""


def test_ncu_details_csv_gives_bandwidth_and_flops_against_the_peaks() -> None:
    kernels = summarize_kernels(parse_ncu_csv(NCU_DETAILS))
    assert [k.kernel for k in kernels] == ["_rmsnorm_kernel", "elementwise_kernel"]
    k = kernels[0]
    assert k.time_s == pytest.approx(8e-6)
    assert k.bandwidth == pytest.approx(16_793_600 / 8e-6)  # 2.1 TB/s
    assert k.peak_bandwidth == pytest.approx(1024 * 3.27e9)  # 3.35 TB/s
    assert k.bandwidth_fraction == pytest.approx(0.627, abs=1e-3)
    # FADD + FMUL + 2 FFMA (the "n/a" fp16 counter is left out)
    assert k.flops == pytest.approx(4_194_304 + 8_388_608 + 2 * 4_194_304)
    assert k.peak_flops_per_s == pytest.approx(2 * 16_896 * 1.755e9)
    assert "TB/s (63% of 3.35 TB/s)" in k.line()
    # Units are converted whatever prefix ncu chose.
    assert kernels[1].time_s == pytest.approx(2.5e-6)
    assert kernels[1].dram_bytes == pytest.approx(64e3)
    assert kernels[1].flops is None and kernels[1].peak_bandwidth is None


def test_ncu_raw_csv_with_its_units_row() -> None:
    [k] = summarize_kernels(parse_ncu_csv(NCU_RAW))
    assert (k.kernel, k.launch_id) == ("gemm_kernel", "0")
    assert k.bandwidth == pytest.approx(2e6 / 1e-6)


def test_ncu_without_a_table_gives_nothing() -> None:
    assert parse_ncu_csv("==ERROR== Failed to find metric foo\n") == {}
    assert summarize_kernels({}) == []
