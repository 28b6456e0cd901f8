"""flashtune on a Ray cluster: `flashtune run --ray` and `flashtune tune --ray` (docs/ray.md).

Ray is an optional extra (``pip install "flashtune[ray]"``): importing this package does not
import ray; connecting (`connect.connected`) does, and says how to install it when it is
missing.
"""

from __future__ import annotations

from flashtune.bench.ray.connect import RAY_MISSING, ClusterError, connected, require_ray
from flashtune.bench.ray.pool import RayPool

__all__ = ["RAY_MISSING", "ClusterError", "RayPool", "connected", "require_ray"]
