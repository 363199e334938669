"""One answer to "CPU or CUDA?": DS_ACCELERATOR=cpu wins over a visible GPU, and NVML is not asked on CPU."""

from __future__ import annotations

import torch

from repro import devices


def test_ds_accelerator_cpu_forces_the_cpu_paths_even_with_cuda_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert devices.on_cpu() and devices.default_device() == torch.device("cpu")
    assert devices.nvml_used_gb() is None


def test_without_the_override_cuda_availability_decides(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.on_cpu()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not devices.on_cpu()


def test_nvml_is_asked_about_the_physical_gpus_cuda_visible_devices_names(monkeypatch):
    # A peer on GPUs 2,3 of a 4-GPU host must be measured on 2 and 3, not on NVML's 0 and 1.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert devices._nvml_indices(4) == [2, 3]
    assert devices._nvml_indices(1) == [2]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices._nvml_indices(3) == [0, 1, 2]

