"""Small valid dataset records that tests in several folders start from.

tests/ has no __init__.py: pytest puts each test folder (and tests/ itself, for its conftest)
on sys.path, so test modules import this as `_examples`.
"""

from __future__ import annotations

GOOD_DEFINITION = {
    "name": "scale_h8",
    "op_type": "scale",
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
    "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(x):\n    return x * 2\n",
}
