"""`flashinfer.testing`: the helpers FlashInfer's tests import from it (testing/utils.py)."""
