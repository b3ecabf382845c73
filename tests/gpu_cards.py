"""The properties of real GPUs, as values: tests of the GPU path run on a CPU with these
(tests/test_gpu_path.py, tests/test_gpu_feed.py)."""

from __future__ import annotations

from dprflow.hardware import DeviceInfo

# torch.cuda.get_device_properties of the real cards (bytes as torch reports them).
H100 = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", 85_029_158_912, bf16=True, capability=(9, 0))
V100 = DeviceInfo("cuda", 0, "Tesla V100-SXM2-16GB", 16_935_682_048, bf16=False, capability=(7, 0))
