"""`flashinfer.utils`: the helpers FlashInfer's tests import from it."""

import torch


def get_compute_capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        raise ValueError("device must be a cuda device")
    return torch.cuda.get_device_capability(device.index)


def device_support_pdl(device: torch.device) -> bool:
    return device.type == "cuda" and get_compute_capability(device)[0] >= 9


def is_sm90a_supported(device: torch.device) -> bool:
    return device.type == "cuda" and get_compute_capability(device)[0] == 9


def is_sm100a_supported(device: torch.device) -> bool:
    return device.type == "cuda" and get_compute_capability(device)[0] == 10
