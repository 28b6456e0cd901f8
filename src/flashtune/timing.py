"""The one timer used by the autotuner and the benchmark runner.

Both use this module, so a tactic that wins tuning also wins the benchmark. On a GPU it:
- warms up (compilation, module load, allocator, GPU clocks) outside the timed region;
- rotates through several copies of the inputs, more bytes than the L2 holds, so no timed
  call finds its inputs cache-resident (cold L2);
- times with CUDA events, or replays a CUDA graph of many calls so that launch-bound and
  multi-kernel solutions are not measured as host launch overhead;
- reports the median and the spread (min, max, interquartile range) over repetitions.
On the CPU it times with `time.perf_counter` with the same statistics.

Two entry points:
- `measure`: fixed call counts, one method chosen by the caller (the autotuner's timer: it
  times many tactics and keeps each cheap). `use_cuda_graph=True` raises when the callable
  cannot be captured.
- `measure_robust`: the benchmark runner's timer. It tries a CUDA graph first for every
  callable and falls back to CUDA events when capture is impossible, sizes each sample to
  last about `target_sample_ms`, warms up and samples for a minimum *time* rather than a
  call count, and takes the median over several trials. `Timing.method` records which
  method produced the numbers.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch

__all__ = [
    "CallRotation",
    "Timing",
    "TimingMethod",
    "CaptureError",
    "EmptyGraphError",
    "graph_node_count",
    "measure",
    "measure_robust",
    "TimingPolicy",
    "l2_bytes",
    "clone_inputs",
    "tensor_bytes",
    "copies_for_cold_l2",
    "cold_l2_sets",
    "median_ci",
    "relative_spread",
    "CI_CONFIDENCE",
]

# Bound once, at import: a solution that later replaces `time.perf_counter` does not move
# the harness's clock (the sandbox also reports such a replacement as tampering).
_clock = time.perf_counter

# An L2 size to assume when the device cannot tell us (H100: 50 MB, H200: 60 MB).
_DEFAULT_L2_BYTES = 64 * 2**20

TimingMethod = Literal["cuda_graph", "cuda_events", "device_sync", "cpu"]
# after(replay, results): see measure_robust.
AfterTiming = Callable[[Callable[[], None] | None, dict[int, Any]], None]


class CaptureError(RuntimeError):
    """The callable cannot be captured into a CUDA graph (e.g. it syncs with the host)."""


class EmptyGraphError(RuntimeError):
    """A capture succeeded but recorded no GPU work: the callable launched its work on a
    stream outside the capture (or did none). Its replay would time nothing, so this is an
    error, never a time."""


@dataclass(frozen=True)
class Timing:
    """Latency statistics of one measured callable, in milliseconds per call.

    method: how it was timed ("cuda_graph", "cuda_events" or "cpu").
    calls_per_sample: calls inside one timed sample (one graph replay, or one event pair).
    trial_medians_ms: the median of each trial (`measure_robust`); `median_ms` is their
    median, and their range says how stable the measurement was.
    fallback: why a CUDA graph was not used, when one was tried and failed.
    ci_low_ms / ci_high_ms: a distribution-free confidence interval of the median over all
    samples (`median_ci`), widened to contain `median_ms`; None where not computed.
    """

    median_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    mean_ms: float
    repetitions: int
    method: str = "cpu"
    calls_per_sample: int = 1
    trial_medians_ms: tuple[float, ...] = ()
    fallback: str | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def trial_spread_ms(self) -> float:
        """max - min of the trial medians (0 with a single trial)."""
        t = self.trial_medians_ms
        return (max(t) - min(t)) if len(t) > 1 else 0.0

    @property
    def interval(self) -> tuple[float, float] | None:
        """(ci_low_ms, ci_high_ms), or None."""
        if self.ci_low_ms is None or self.ci_high_ms is None:
            return None
        return (self.ci_low_ms, self.ci_high_ms)

    @property
    def relative_spread(self) -> float | None:
        """The interval's larger half-width over the median (0.05: within 5%), or None."""
        if self.interval is None or self.median_ms <= 0:
            return None
        return _half_width(self.median_ms, *self.interval)


def _half_width(median: float, low: float, high: float) -> float:
    return max(median - low, high - median) / median if median > 0 else math.inf


# The confidence of the intervals `median_ci` gives (below 6 samples no interval of order
# statistics reaches it: there it is [min, max], of confidence 1 - 2^(1 - n)).
CI_CONFIDENCE = 0.95


def median_ci(samples: Sequence[float], confidence: float = CI_CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of `samples`: the order
    statistics x(k), x(n + 1 - k) with the largest k such that P(Binomial(n, 1/2) < k) <=
    (1 - confidence) / 2. CPU timings are skewed and often bimodal (descheduled calls): no
    normal or bootstrap interval is honest at a few samples. [min, max] if no k qualifies."""
    ordered = sorted(float(x) for x in samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    alpha = (1.0 - confidence) / 2
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2.0**n
        if nxt > alpha:
            break
        below, k = nxt, k + 1
    k = max(k, 1)  # 1-based rank of the lower bound
    return ordered[k - 1], ordered[n - k]


def relative_spread(samples: Sequence[float]) -> float:
    """`Timing.relative_spread` of these samples: the larger half of `median_ci` over the
    median (inf for a median of 0)."""
    return _half_width(statistics.median(samples), *median_ci(samples))


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_L2_BYTES
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or _DEFAULT_L2_BYTES)


def tensor_bytes(values: Iterable[Any]) -> int:
    """Bytes held by the tensors among `values` (an input set's arguments, or its values by
    name); other values count nothing."""
    return sum(a.numel() * a.element_size() for a in values if isinstance(a, torch.Tensor))


def clone_inputs(args: Sequence[Any]) -> list[Any]:
    """A copy of `args` with every tensor cloned (same strides), non-tensors shared."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def copies_for_cold_l2(args: Sequence[Any], device: torch.device, max_copies: int = 64) -> int:
    """How many input copies to rotate through so that each timed call misses the L2."""
    nbytes = max(tensor_bytes(args), 1)
    # Twice the L2: LRU-ish replacement keeps some of the last sets resident.
    return max(1, min(max_copies, math.ceil(2 * l2_bytes(device) / nbytes)))


def _enough(
    now: float, start: float, deadline: float, done: int, wanted: int, min_ms: float
) -> bool:
    """Stop sampling: past the deadline, or `wanted` samples (calls) taking `min_ms` or more."""
    return now > deadline or (done >= wanted and (now - start) * 1e3 >= min_ms)


def _stats(samples_ms: list[float], method: str = "cpu", calls_per_sample: int = 1) -> Timing:
    samples_ms = sorted(samples_ms)
    n = len(samples_ms)
    q1 = samples_ms[n // 4]
    q3 = samples_ms[(3 * n) // 4] if n > 1 else samples_ms[0]
    low, high = median_ci(samples_ms)
    return Timing(
        median_ms=statistics.median(samples_ms),
        min_ms=samples_ms[0],
        max_ms=samples_ms[-1],
        iqr_ms=q3 - q1,
        mean_ms=statistics.fmean(samples_ms),
        repetitions=n,
        method=method,
        calls_per_sample=calls_per_sample,
        ci_low_ms=low,
        ci_high_ms=high,
    )


def _device_of(args: Sequence[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def cold_l2_sets(sets: Sequence[Sequence[Any]], device: torch.device) -> list[list[Any]]:
    """`sets` followed by clones of them, round robin (set i is a copy of set i mod
    len(sets)), until their bytes exceed twice the L2 on a GPU (`copies_for_cold_l2`)."""
    out = [list(x) for x in sets]
    if device.type != "cuda":
        return out
    need = copies_for_cold_l2(out[0], device)
    base = len(out)
    while len(out) < need:
        out.append(clone_inputs(out[len(out) % base]))
    return out


def _default_input_sets(
    args: Sequence[Any], device: torch.device, cold_l2: bool
) -> list[Sequence[Any]]:
    copies = copies_for_cold_l2(args, device) if (cold_l2 and device.type == "cuda") else 1
    return [list(args)] + [clone_inputs(args) for _ in range(copies - 1)]


# --------------------------------------------------------------------------- measure


def measure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 10,
    repetitions: int = 50,
    cold_l2: bool = True,
    use_cuda_graph: bool = False,
    calls_per_graph: int = 20,
    input_sets: Sequence[Sequence[Any]] | None = None,
    max_seconds: float = 10.0,
) -> Timing:
    """Time `fn(*args)` and return latency statistics per call (milliseconds).

    input_sets: explicit input copies to rotate through (e.g. with freshly randomized
    values); by default `args` is cloned as often as cold L2 needs on a GPU.
    use_cuda_graph: replay a graph of `calls_per_graph` calls; raises `CaptureError` when
    `fn` cannot be captured (the CUDA context stays usable).
    max_seconds: repetitions stop early once this much time has been spent, so one very
    slow candidate cannot stall tuning.
    """
    device = _device_of(args)
    if input_sets is None:
        input_sets = _default_input_sets(args, device, cold_l2)
    if device.type != "cuda":
        return _measure_cpu(fn, input_sets, warmup, repetitions, max_seconds)
    with torch.cuda.device(device):
        calls = CallRotation(fn, input_sets)
        calls.warm_up(warmup, 0.0, max_seconds)
        if use_cuda_graph:
            graph = calls.capture(calls_per_graph)
            return _sample_graph(graph, calls_per_graph, calls.stream, repetitions, 0, max_seconds)
        return _sample_events(calls, 1, repetitions, 0.0, max_seconds)


# Samples the spread rule of `_measure_cpu` takes at most (each check sorts them all).
MAX_SPREAD_SAMPLES = 1000


def _measure_cpu(
    fn,
    input_sets,
    warmup,
    repetitions,
    max_seconds,
    min_ms: float = 0.0,
    spread: float | None = None,
    spread_seconds: float = 0.0,
) -> Timing:
    """perf_counter around each call. With `spread`, sampling goes on past `repetitions`
    until the median's interval is within `spread` of it (`relative_spread`), for at most
    `spread_seconds` (and `max_seconds`) in all: a handful of CPU samples of a
    sub-millisecond op can hold one descheduled call of 100x the rest."""
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    samples: list[float] = []
    start_all = _clock()
    deadline = start_all + max_seconds
    i = 0
    while True:
        start = _clock()
        fn(*input_sets[i % len(input_sets)])
        now = _clock()
        samples.append((now - start) * 1e3)
        i += 1
        if _enough(now, start_all, deadline, i, repetitions, min_ms):
            over = now > deadline or now - start_all >= spread_seconds
            if spread is None or over or i >= MAX_SPREAD_SAMPLES:
                break
            if (i < 64 or i % 16 == 0) and relative_spread(samples) <= spread:
                break
    return _stats(samples, "cpu")


# --------------------------------------------------------------------------- GPU building blocks


class CallRotation:
    """`fn` over rotating input sets on a private stream, remembering which sets it has
    been called on eagerly (graph capture must only meet sets already seen: whatever is
    built lazily per input, a Triton specialization or a planner's buffers, must exist
    before capture, where compiling, loading a module or a host sync is illegal)."""

    def __init__(self, fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]]) -> None:
        self.fn, self.sets = fn, list(input_sets)
        # A fresh stream: a failed capture invalidates only work on this stream.
        self.stream = torch.cuda.Stream()
        self.touched = 0  # sets[:touched] have had an eager call
        # set index -> what the last captured call on that set returned (graph-owned
        # tensors that every replay rewrites): the harness checks them after timing.
        self.results: dict[int, Any] = {}

    def warm_up(self, calls: int, min_ms: float, max_seconds: float) -> float:
        """At least `calls` calls and `min_ms` of wall time; the wall time per call (an upper
        bound of its GPU time), 0.0 when no call was made."""
        if calls <= 0 and min_ms <= 0:
            return 0.0
        calls = max(calls, 1)
        n = len(self.sets)
        torch.cuda.current_stream().synchronize()
        self.stream.wait_stream(torch.cuda.current_stream())
        start = _clock()
        deadline = start + max_seconds
        i = 0
        with torch.cuda.stream(self.stream):
            while True:
                self.fn(*self.sets[i % n])
                i += 1
                self.touched = max(self.touched, min(i, n))
                if i % 4 == 0 or i >= calls:
                    self.stream.synchronize()  # wall time must include the GPU work
                    now = _clock()
                    if _enough(now, start, deadline, i, calls, min_ms):
                        break
        return (_clock() - start) * 1e3 / i

    def capture(self, calls: int) -> torch.cuda.CUDAGraph:
        """A CUDA graph of `calls` calls, call i on input set i mod len(sets).

        Raises CaptureError when capture is impossible (a host sync, a pageable copy, a
        lazy module load, ...). Unlike `torch.cuda.graph(...)`, whose `__exit__` leaves the
        capture stream current when `capture_end` raises, this always ends the capture,
        restores the caller's stream and synchronizes, so later work finds a sane context."""
        n = len(self.sets)
        with torch.cuda.stream(self.stream):
            for i in range(self.touched, min(calls, n)):
                self.fn(*self.sets[i])
        self.touched = max(self.touched, min(calls, n))
        torch.cuda.synchronize()
        self.stream.wait_stream(torch.cuda.current_stream())
        graph = _new_graph()
        pool = torch.cuda.graph_pool_handle()  # named, so a failed capture's can be released
        error: BaseException | None = None
        results: dict[int, Any] = {}
        with torch.cuda.stream(self.stream):
            try:
                graph.capture_begin(pool=pool, capture_error_mode="global")
            except Exception as exc:  # noqa: BLE001 - e.g. a capture already under way
                raise CaptureError(f"capture_begin: {type(exc).__name__}: {exc}") from exc
            try:
                for i in range(calls):
                    results[i % n] = self.fn(*self.sets[i % n])
            except Exception as exc:  # noqa: BLE001 - e.g. .item() / .cpu() in the solution
                error = exc
            try:
                graph.capture_end()
            except Exception as exc:  # noqa: BLE001 - the capture was invalidated
                error = error or exc
        if error is not None:
            del graph, results
            _release_failed_capture_pool(pool)
            _recover_after_capture()
            raise CaptureError(f"{type(error).__name__}: {str(error).strip()[:300]}") from error
        nodes = graph_node_count(graph)
        if nodes == 0:
            del graph, results
            raise EmptyGraphError(
                f"the CUDA graph of {calls} call(s) captured no GPU work: the work ran on a "
                "stream outside the capture, or there was none"
            )
        if hasattr(graph, "instantiate"):
            graph.instantiate()
        self.results = results
        return graph


def _new_graph() -> torch.cuda.CUDAGraph:
    # keep_graph=True keeps the cudaGraph_t after capture so its nodes can be counted.
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # torch before 2.6: no keep_graph, no node count
        return torch.cuda.CUDAGraph()


def graph_node_count(graph: torch.cuda.CUDAGraph) -> int | None:
    """Nodes (kernels, copies, memsets, ...) in a captured graph, or None when this torch or
    driver cannot tell (then the caller skips the check)."""
    import ctypes

    try:
        raw = graph.raw_cuda_graph()
        libcuda = ctypes.CDLL("libcuda.so.1")
    except Exception:  # noqa: BLE001 - no keep_graph support, no driver library
        return None
    count = ctypes.c_size_t(0)
    # CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes);
    # nodes=NULL asks for the count only. cudaGraph_t and CUgraph are the same handle.
    try:
        status = libcuda.cuGraphGetNodes(ctypes.c_void_p(int(raw)), None, ctypes.byref(count))
    except Exception:  # noqa: BLE001 - an unexpected handle type: no count
        return None
    return int(count.value) if status == 0 else None


def _reset_cuda_generator() -> None:
    """Take the default CUDA generator out of capture mode after a failed capture.

    capture_begin puts the generator in capture mode and only a successful capture_end
    takes it out; when the capture was invalidated (a host sync in the solution), every
    later random draw on the device fails with "Offset increment outside graph capture
    encountered unexpectedly" (seen on an H200 in tests that ran after such a capture).
    A fresh generator state, seeded like the old one, replaces the stuck one."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    fresh = torch.Generator(device="cuda")
    fresh.manual_seed(generator.initial_seed())
    generator.graphsafe_set_state(fresh.graphsafe_get_state())


def _release_failed_capture_pool(pool: Any) -> None:
    """Give back the memory pool of a capture that failed to end.

    torch (2.11 at least) checks cudaStreamEndCapture's error before it tells the allocator
    that the capture is over, and a graph whose capture never ended does not release its
    pool: every block allocated during the capture stayed reserved for the life of the
    process, beyond empty_cache. Seen on an H100: an 8k-token prefill reference (a Python
    loop with host syncs) failed its capture and left the benchmark worker holding 57 GB, and
    the next solution ran out of memory. Ending the pool's allocation and releasing it lets
    empty_cache free it. Where torch did end it, the first call is refused (no capture to
    the pool is under way) and nothing more is done: the graph released its pool itself."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:  # pragma: no cover - a torch without the hooks
        return
    device = torch.cuda.current_device()
    try:
        end(device, pool)
    except RuntimeError:
        return
    release(device, pool)


def _recover_after_capture() -> None:
    """Leave the CUDA context usable after a failed capture: make sure no stream is still
    capturing, release the dead graph's memory pool, and clear the non-sticky error the
    capture left behind (a failed torch CUDA check clears it; a launch by other code, e.g.
    Triton, may not, and the next kernel launch of an innocent solution would report it)."""
    import gc

    if torch.cuda.is_current_stream_capturing():  # pragma: no cover - defensive
        raise RuntimeError("a CUDA stream is still capturing after a failed capture")
    _reset_cuda_generator()
    gc.collect()  # the failed graph's private memory pool goes with the graph object
    for attempt in range(2):
        try:
            torch.ones(1, device="cuda").add_(1)  # a launch: reports (and clears) a stale error
            torch.cuda.synchronize()
            return
        except RuntimeError:
            # cudaErrorStreamCaptureInvalidated/Unsupported are not sticky: reported once,
            # then the context works again. A sticky error raises again here.
            if attempt:
                raise


def _sample_events(
    calls: CallRotation, calls_per_sample: int, repetitions: int, min_ms: float, max_seconds: float
) -> Timing:
    """Samples of `calls_per_sample` back-to-back calls between two CUDA events."""
    fn, input_sets, stream = calls.fn, calls.sets, calls.stream
    samples_ev: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    n = len(input_sets)
    start_all = _clock()
    deadline = start_all + max_seconds
    call = 0
    with torch.cuda.stream(stream):
        while True:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(calls_per_sample):
                fn(*input_sets[call % n])
                call += 1
            calls.touched = max(calls.touched, min(call, n))
            end.record(stream)
            samples_ev.append((start, end))
            if len(samples_ev) % 8 == 0 or len(samples_ev) >= repetitions:
                stream.synchronize()  # keep the host within a few samples of the device
                now = _clock()
                if _enough(now, start_all, deadline, len(samples_ev), repetitions, min_ms):
                    break
    stream.synchronize()
    samples = [s.elapsed_time(e) / calls_per_sample for s, e in samples_ev]
    return _stats(samples, "cuda_events", calls_per_sample)


def _sample_device_wide(
    calls: CallRotation, calls_per_sample: int, repetitions: int, min_ms: float, max_seconds: float
) -> Timing:
    """Samples of `calls_per_sample` back-to-back calls bracketed by device-wide
    synchronizations and the harness clock: work the callable launches on any stream of
    the device counts (events on one stream would miss a side stream's kernels). The
    synchronization costs a few microseconds per sample, which lasts ~`target_sample_ms`."""
    fn, input_sets, stream = calls.fn, calls.sets, calls.stream
    samples: list[float] = []
    n = len(input_sets)
    start_all = _clock()
    deadline = start_all + max_seconds
    call = 0
    with torch.cuda.stream(stream):
        while True:
            torch.cuda.synchronize()
            start = _clock()
            for _ in range(calls_per_sample):
                fn(*input_sets[call % n])
                call += 1
            torch.cuda.synchronize()
            now = _clock()
            samples.append((now - start) * 1e3 / calls_per_sample)
            calls.touched = max(calls.touched, min(call, n))
            if _enough(now, start_all, deadline, len(samples), repetitions, min_ms):
                break
    return _stats(samples, "device_sync", calls_per_sample)


def _sample_graph(
    graph: torch.cuda.CUDAGraph,
    calls_per_graph: int,
    stream,
    repetitions: int,
    min_ms: float,
    max_seconds: float,
) -> Timing:
    """One sample per graph replay, divided by the calls it holds."""
    samples_ev: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    start_all = _clock()
    deadline = start_all + max_seconds
    with torch.cuda.stream(stream):
        while True:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            samples_ev.append((start, end))
            if len(samples_ev) % 8 == 0 or len(samples_ev) >= repetitions:
                stream.synchronize()
                now = _clock()
                if _enough(now, start_all, deadline, len(samples_ev), repetitions, min_ms):
                    break
    stream.synchronize()
    samples = [s.elapsed_time(e) / calls_per_graph for s, e in samples_ev]
    return _stats(samples, "cuda_graph", calls_per_graph)


# --------------------------------------------------------------------------- measure_robust


@dataclass(frozen=True)
class TimingPolicy:
    """How `measure_robust` measures (its docstring says why each choice is made). Minimums:
    `warmup` calls and `warmup_ms` (GPU) of warm-up, `repetitions` samples and `trial_ms`
    per trial; `max_seconds` bounds each. Method "cuda_graph" raises CaptureError instead
    of falling back. On the CPU, `spread` (None: off) samples on until the median's 95%
    interval is within it, for at most `spread_seconds`."""

    method: Literal["auto", "cuda_graph", "cuda_events"] = "auto"
    cold_l2: bool = True
    warmup: int = 1
    warmup_ms: float = 25.0
    repetitions: int = 5
    trial_ms: float = 100.0
    trials: int = 3
    target_sample_ms: float = 1.0
    max_calls_per_sample: int = 1000
    max_seconds: float = 10.0
    spread: float | None = None
    spread_seconds: float = 0.0


def measure_robust(
    fn: Callable[..., Any],
    args: Sequence[Any],
    policy: TimingPolicy = TimingPolicy(),
    *,
    input_sets: Sequence[Sequence[Any]] | None = None,
    after: AfterTiming | None = None,
) -> Timing:
    """Time `fn(*args)` reproducibly, as `policy` says; return per-call statistics of the
    median trial.

    after: called once timing is over, while what was timed still exists, as
    `after(replay, results)`: with a CUDA graph, `replay()` runs the timed graph once more
    and `results[i]` is what the graph's last call on input set i returned, rewritten by
    every replay (a graph of fewer calls than sets has no entry for the later sets);
    otherwise `replay` is None and
    `results` is empty (call `fn` again). The benchmark checks the timed work with it.

    The choices, and what each one fixes:
    - method "auto" captures a CUDA graph first for every callable and falls back to CUDA
      events only when capture raises, so every solution of a workload, the reference and
      the baselines are timed the same way whatever their latency. (A latency threshold
      chose graphs only for fast kernels: multi-kernel solutions just above it were timed
      with host launch gaps included, and a kernel near it flipped method between runs.)
    - each sample (one graph replay, or one pair of events around back-to-back calls) lasts
      about `target_sample_ms`: event resolution (~0.5 us) and replay/launch overhead are
      then negligible next to the sample, even for a 2 us kernel.
    - warm-up lasts at least `warmup_ms` (and `warmup` calls) on the GPU: compiling,
      autotuning caches, allocator growth and the GPU clock ramping up out of idle
      all happen there, not in the first samples.
    - each trial samples for at least `trial_ms` (and `repetitions` samples): a fixed,
      small call count of a fast kernel covered well under a millisecond, where one
      interruption or clock change moves the median.
    - the median over `trials` trials (each itself a median) damps a disturbance that
      spans a whole trial; the trial medians are returned so the spread can be reported.
    - cold L2: calls rotate over `input_sets` (default: enough clones of `args` to exceed
      twice the L2), inside the graph as well.
    - a graph that captured no GPU work raises `EmptyGraphError` (work launched on a stream
      outside the capture would otherwise time as nothing); without a graph, samples are
      bracketed by device-wide synchronizations (method "device_sync"), so work on every
      stream counts.
    On the CPU: perf_counter around each call (method "cpu"), same trials and minimums;
    with `spread`, each trial samples on until its median's 95% interval is within `spread`
    of it or `spread_seconds` have passed (`_measure_cpu`).
    """
    p = policy
    device = _device_of(args)
    if input_sets is None:
        input_sets = _default_input_sets(args, device, p.cold_l2)
    input_sets = list(input_sets)
    trials = max(1, p.trials)
    if device.type != "cuda":
        for i in range(p.warmup):
            fn(*input_sets[i % len(input_sets)])
        rule = (max(p.repetitions, 1), p.max_seconds, p.trial_ms, p.spread, p.spread_seconds)
        results = [_measure_cpu(fn, input_sets, 0, *rule) for _ in range(trials)]
        if after is not None:
            after(None, {})
        return _combine(results)
    with torch.cuda.device(device):
        return _measure_robust_gpu(fn, input_sets, policy, after)


def _measure_robust_gpu(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    policy: TimingPolicy,
    after: AfterTiming | None = None,
) -> Timing:
    p = policy
    repetitions, trials = max(p.repetitions, 1), max(p.trials, 1)
    max_calls, target_ms, max_seconds = (
        max(1, p.max_calls_per_sample),
        p.target_sample_ms,
        p.max_seconds,
    )
    calls = CallRotation(fn, input_sets)
    per_call_ms = calls.warm_up(max(p.warmup, 1), p.warmup_ms, max_seconds)
    # Wall time per call bounds GPU time from above, so this is a lower bound of the calls a
    # sample needs; graphs are re-sized below from a measured replay.
    per_sample = _calls_for(target_ms, per_call_ms, max_calls)
    fallback = None
    if p.method in ("auto", "cuda_graph"):
        try:
            graph, per_sample = _sized_graph(calls, per_sample, target_ms, max_calls)
        except CaptureError as exc:
            if p.method == "cuda_graph":
                raise
            fallback = str(exc)
        else:
            results = [
                _sample_graph(graph, per_sample, calls.stream, repetitions, p.trial_ms, max_seconds)
                for _ in range(trials)
            ]
            if after is not None:
                after(_replayer(graph, calls.stream), calls.results)
            del graph
            return _combine(results)
    if fallback is not None:
        # The dead graph and what the capture allocated in its private pool live as long as
        # the exception's frames (a reference cycle): free them before running eagerly. Seen
        # on an H100: a reference whose capture failed at a host sync kept tens of GB
        # reserved while it then ran eagerly, and the next workload ran out of memory.
        gc.collect()
        torch.cuda.empty_cache()
        # The capture may have left lazily built state half-made (a workspace allocated
        # into the dead graph's pool): warm up again, eagerly, before timing eagerly.
        per_call_ms = calls.warm_up(max(p.warmup, 1), p.warmup_ms, max_seconds)
        per_sample = _calls_for(target_ms, per_call_ms, max_calls)
    results = [
        _sample_device_wide(calls, per_sample, repetitions, p.trial_ms, max_seconds)
        for _ in range(trials)
    ]
    if after is not None:
        after(None, {})
    return replace(_combine(results), fallback=fallback)


def _replayer(graph: torch.cuda.CUDAGraph, stream) -> Callable[[], None]:
    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()
        torch.cuda.synchronize()

    return replay


def _calls_for(target_ms: float, per_call_ms: float, max_calls: int) -> int:
    if target_ms <= 0 or per_call_ms <= 0:
        return 1
    return max(1, min(max_calls, math.ceil(target_ms / per_call_ms)))


def _sized_graph(
    calls: CallRotation, per_graph: int, target_ms: float, max_calls: int
) -> tuple[torch.cuda.CUDAGraph, int]:
    """Capture, time a few replays, and recapture with more calls if a replay is shorter
    than `target_ms` (the eager estimate includes host time, so it undercounts calls for
    launch-bound solutions). The replays double as warm-up of the graph itself."""
    graph = calls.capture(per_graph)
    # Few replays when one lasts long (a slow reference): this is only a size check.
    replay_ms = _replay_ms(graph, calls.stream, replays=1 if per_graph == 1 else 3)
    if replay_ms < 0.8 * target_ms and per_graph < max_calls:
        bigger = _calls_for(target_ms, max(replay_ms / per_graph, 1e-6), max_calls)
        if bigger > per_graph:
            del graph
            graph, per_graph = calls.capture(bigger), bigger
            _replay_ms(graph, calls.stream)  # uploads the new graph, warms it up
    return graph, per_graph


def _replay_ms(graph: torch.cuda.CUDAGraph, stream, replays: int = 3) -> float:
    with torch.cuda.stream(stream):
        graph.replay()  # the first replay uploads the graph: not representative
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(replays):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / replays


def _combine(results: list[Timing]) -> Timing:
    """Median of the trial medians; IQR: the median trial IQR; min/max/mean over all; the
    interval: from the lowest trial's lower bound to the highest trial's upper bound (a
    disturbance that moved a whole trial widens it)."""
    medians = tuple(r.median_ms for r in results)
    reps = sum(r.repetitions for r in results)
    median = statistics.median(medians)
    lows = [r.ci_low_ms for r in results if r.ci_low_ms is not None]
    highs = [r.ci_high_ms for r in results if r.ci_high_ms is not None]
    return replace(
        results[0],
        ci_low_ms=min([*lows, median]) if lows else None,
        ci_high_ms=max([*highs, median]) if highs else None,
        median_ms=median,
        min_ms=min(r.min_ms for r in results),
        max_ms=max(r.max_ms for r in results),
        iqr_ms=statistics.median(r.iqr_ms for r in results),
        mean_ms=sum(r.mean_ms * r.repetitions for r in results) / reps,
        repetitions=reps,
        trial_medians_ms=medians,
    )
