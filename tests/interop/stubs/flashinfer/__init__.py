"""A stand-in for FlashInfer where it is not installed (a CPU machine): FlashInfer-Bench's source
imports `flashinfer.testing.bench_gpu_time_with_cupti` at import time, for GPU timing only.
Put on PYTHONPATH by tests/_fib.py only when no real FlashInfer is importable."""
