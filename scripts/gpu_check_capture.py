"""GPU check: a failed graph capture must leave the device's random generator usable."""

import torch

from flashtune.timing import CaptureError, measure_robust


def syncing(x):
    return x * float(x.sum().item())  # a host sync: cannot be captured


x = torch.randn(1024, device="cuda")
try:
    t = measure_robust(syncing, [x])
    print("method", t.method)
except CaptureError as exc:
    print("capture error", exc)
y = torch.randn(16, device="cuda")  # failed before the generator reset
print("random after failed capture ok:", tuple(y.shape))
