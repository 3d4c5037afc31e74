"""The vendors' hardware profiles, registered by name, and where every figure of each comes from.

Every figure is a vendor's nominal number, cited below (each profile's ``sources``,
``HardwareProfile.source_of``), or a measurement, cited with the tool and the file it came from.

Sources:
- V100: NVIDIA Tesla V100 datasheet (PCIe: 14 TFLOPS FP32, SXM2: 15.7 TFLOPS,
  HBM2 900 GB/s). PCIe 3.0 x16: 15.75 GB/s per direction.
- POWER9 AC922 with V100 SXM2 32GB: NVLink 2.0 CPU-GPU, 3 bricks x 25 GB/s = 75 GB/s
  per direction (IBM AC922 redbook; the setting of the TFLMS paper).
- POWER9 AC922 with V100 SXM2 16GB (``v100-16gb-nvlink2``, TFLMS's hardware class: Le et al.,
  ISMM 2019, trained on 16 GB V100s in an AC922): the same NVLink 2.0 host link, 3 bricks x
  25 GB/s = 75 GB/s per direction (IBM Redbook REDP-5472, "IBM Power System AC922 Introduction
  and Technical Overview", four-GPU configuration), 15.7 TFLOPS FP32 and 900 GB/s HBM2 (NVIDIA
  Tesla V100 SXM2 datasheet).
- A100 80GB PCIe: 19.5 TFLOPS FP32, 1935 GB/s HBM2e (NVIDIA A100 datasheet); PCIe 4.0 x16:
  31.5 GB/s per direction.
- H100 80GB PCIe: 51 TFLOPS FP32, 2.0 TB/s HBM2e (NVIDIA H100 datasheet); PCIe 5.0 x16:
  63 GB/s per direction.
- GH200 Grace Hopper: H100 with 96 GB HBM3 (67 TFLOPS FP32, 4 TB/s), NVLink-C2C 900 GB/s total,
  450 GB/s per direction, 480 GB LPDDR5X host memory (NVIDIA GH200 datasheet).
"""

from __future__ import annotations

from tflms.profiles.hardware import GIB, HardwareProfile
from tflms.profiles.registry import register_profile

# ---------------------------------------------------------------------------------------------- citations
_V100 = "NVIDIA Tesla V100 GPU datasheet (Jul 2017), https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf"
_AC922 = "IBM Redbook REDP-5472, IBM Power System AC922 Introduction and Technical Overview (NVLink 2.0, 3 x 25 GB/s per direction)"
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
         "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-tensor-core/"
         "nvidia-tensor-core-gpu-datasheet")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet / product page (2024), https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet (2023), https://resources.nvidia.com/en-us-grace-cpu/"
          "grace-hopper-superchip")
_PCIE3 = "PCI Express 3.0 x16: 8 GT/s x 16 lanes, 128b/130b = 15.75 GB/s per direction (PCI-SIG PCIe 3.0 base spec)"
_PCIE4 = "PCI Express 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per direction (PCI-SIG PCIe 4.0 base spec)"
_PCIE5 = "PCI Express 5.0 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s per direction (PCI-SIG PCIe 5.0 base spec)"
_SPARSE = " (the datasheet's 'with sparsity' figure halved: dense)"
#: Issue 28's measurements (PyTorch, random data, mean of ten after warm-up): an 8192^3 bfloat16 product
#: and a device-to-device copy (bytes read plus written).
_H100_MEASURED_MM = "measured on an H100 80GB HBM3 (issue 28): 8192^3 bf16 MatMul 798 TFLOP/s / 989.5 = 0.81"
_H100_MEASURED_COPY = "measured on an H100 80GB HBM3 (issue 28): device copy 3.0 TB/s / 3.35 = 0.90"
_H200_MEASURED_MM = "measured on an H200 (issue 28): 8192^3 bf16 MatMul 788 TFLOP/s / 989.5 = 0.80"
_H200_MEASURED_COPY = "measured on an H200 (issue 28): device copy 4.3 TB/s / 4.8 = 0.90"
#: tools/gpu_probe.py --conv-layers, twice on an H100 80GB HBM3 (2026-11-26,
#: docs/profiles/h100-80gb-hbm3-conv-layers.json and h100-80gb-hbm3-elementwise.json): ResNet-50's 13 stride-1
#: convolution shapes at batch 64, forward and both gradients, float32 (TF32) and bfloat16, each at its faster
#: layout; `tools/compare_profile.py A B --fit-conv` fits the efficiency at which the roofline (with the
#: contraction latency below) predicts their total time (geometric mean over both runs and dtypes; 0.250 for
#: TF32 alone, 0.173 for bfloat16 alone).
_H100_MEASURED_CONV = ("measured on an H100 80GB HBM3 (tools/gpu_probe.py --conv-layers, two runs, 2026-11-26, "
                       "docs/profiles/h100-80gb-hbm3-conv-layers.json, h100-80gb-hbm3-elementwise.json): "
                       "ResNet-50's convolutions at batch 64, forward and backward, reach 85-96 TFLOP/s in TF32 and "
                       "108-137 in BF16; tools/compare_profile.py --fit-conv over both runs, with the "
                       "14.5 us contraction latency: 0.210")
#: tools/gpu_probe.py --matmul-n 1024 / 2048 / 4096 on an H100 80GB HBM3 (2026-11-26,
#: docs/profiles/h100-80gb-hbm3-n*.json): bf16 products at 105 / 468 / 747 TFLOP/s and tf32 at 69 / 268 / 386
#: against 795 / 413 at 8192^3. The roofline with the launch overhead priced them up to 3x too fast; 14.5 us
#: more per contraction makes the geometric mean of predicted over measured time over the six 1.
_H100_MEASURED_LATENCY = ("measured on an H100 80GB HBM3 (tools/gpu_probe.py --matmul-n 1024/2048/4096, 2026-11-26, "
                          "docs/profiles/h100-80gb-hbm3-n*.json): bf16 and tf32 products of those sizes take "
                          "7.5-21 us more than the roofline and launch overhead; fitted over the six: 14.5 us")
_H100_MEASURED_LINK = ("measured on an H100 80GB HBM3 and an H200 (tools/gpu_probe.py, 2026-11-26, "
                       "docs/profiles/h100-80gb-hbm3.json, docs/profiles/h200.json): pinned copies 54.5-55.2 GB/s "
                       "each way of PCIe 5.0's 63 = 0.87")
_ASSUMED = (" -- assumed from the H100 SXM5 measurement of issue 28 (same cuBLAS/cuDNN kernel class), not measured "
            "on this GPU; tools/gpu_probe.py measures it")
_TFLMS = "tflms default, not a vendor figure (kept from the first profiles)"
_HOST_SERVER = "assumed: a two-socket PCIe server (a system figure, not the GPU's)"


def _cite(**sources: str) -> dict[str, str]:
    return sources


_V100_COMMON = _cite(memory_gbps=_V100 + ": HBM2 900 GB/s", compute_efficiency=_TFLMS,
                     link_efficiency=_TFLMS, link_latency_s=_TFLMS, launch_overhead_s=_TFLMS)

for _p in (
    # V100: no TF32, no BF16 (Volta); float32 contractions stay at FP32, so the V100 rows of
    # docs/results.md do not move. FP16 tensor cores: 112 TFLOPS (PCIe), 125 TFLOPS (SXM2).
    HardwareProfile("v100-16gb-pcie3", 16 * GIB, 14e12, 900, 15.75, host_memory_bytes=256 * GIB,
                    fp16_flops=112e12,
                    description="NVIDIA V100 16GB PCIe on PCIe 3.0 x16",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 PCIe 14 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 PCIe 112 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 16 GB HBM2", "link_gbps": _PCIE3,
                             "host_memory_bytes": _HOST_SERVER}),
    HardwareProfile("v100-32gb-nvlink2", 32 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    fp16_flops=125e12,
                    description="NVIDIA V100 SXM2 32GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS paper setup)",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 SXM2 15.7 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 SXM2 125 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 32 GB HBM2", "link_gbps": _AC922,
                             "host_memory_bytes": _AC922 + " (512 GB configuration)"}),
    HardwareProfile("v100-16gb-nvlink2", 16 * GIB, 15.7e12, 900, 75, host_memory_bytes=512 * GIB,
                    fp16_flops=125e12,
                    description="NVIDIA V100 SXM2 16GB on IBM POWER9 AC922, NVLink 2.0 to the CPU (TFLMS's hardware)",
                    sources={**_V100_COMMON, "peak_flops": _V100 + ": V100 SXM2 15.7 TFLOPS FP32",
                             "fp16_flops": _V100 + ": V100 SXM2 125 TFLOPS tensor performance",
                             "memory_bytes": _V100 + ": 16 GB HBM2", "link_gbps": _AC922,
                             "host_memory_bytes": _AC922 + " (512 GB configuration)"}),
    # A100 (Ampere): FP32 19.5, TF32 156, BF16/FP16 312 dense TFLOPS, every form factor.
    HardwareProfile("a100-40gb-pcie4", 40 * GIB, 19.5e12, 1555, 31.5, host_memory_bytes=512 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 40GB PCIe on PCIe 4.0 x16",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 40GB PCIe, 40 GB HBM2",
                        memory_gbps=_A100 + ": A100 40GB PCIe, 1,555 GB/s", link_gbps=_PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    HardwareProfile("a100-80gb-pcie4", 80 * GIB, 19.5e12, 1935, 31.5, host_memory_bytes=512 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 80GB PCIe on PCIe 4.0 x16",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 80GB PCIe, 80 GB HBM2e",
                        memory_gbps=_A100 + ": A100 80GB PCIe, 1,935 GB/s", link_gbps=_PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    HardwareProfile("a100-80gb-sxm4", 80 * GIB, 19.5e12, 2039, 31.5, host_memory_bytes=1024 * GIB,
                    tf32_flops=156e12, fp16_flops=312e12, bf16_flops=312e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    description="NVIDIA A100 80GB SXM4 (HGX A100), PCIe 4.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_A100 + ": FP32 19.5 TFLOPS", tf32_flops=_A100 + ": TF32 Tensor Core 312" + _SPARSE,
                        fp16_flops=_A100 + ": FP16 Tensor Core 624" + _SPARSE,
                        bf16_flops=_A100 + ": BF16 Tensor Core 624" + _SPARSE,
                        memory_bytes=_A100 + ": A100 80GB SXM, 80 GB HBM2e",
                        memory_gbps=_A100 + ": A100 80GB SXM, 2,039 GB/s",
                        link_gbps=_A100 + ": PCIe Gen4 64 GB/s (both directions); " + _PCIE4,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED,
                        host_memory_bytes="NVIDIA DGX A100 datasheet: 1 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # H100 (Hopper). SXM5: FP32 67, TF32 494.5, BF16/FP16 989.5 dense TFLOPS, 3.35 TB/s;
    # PCIe: FP32 51, TF32 378, BF16/FP16 756.5 dense TFLOPS, 2.0 TB/s. Both: PCIe Gen5 128 GB/s to the host.
    HardwareProfile("h100-80gb-sxm5", 80 * GIB, 67e12, 3350, 63, host_memory_bytes=2048 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H100 80GB SXM5 (HGX H100), PCIe 5.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_H100 + ": H100 SXM FP32 67 TFLOPS",
                        tf32_flops=_H100 + ": H100 SXM TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_H100 + ": H100 SXM FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_H100 + ": H100 SXM BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_H100 + ": H100 SXM 80 GB", memory_gbps=_H100 + ": H100 SXM 3.35 TB/s",
                        link_gbps=_H100 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H100_MEASURED_MM, memory_efficiency=_H100_MEASURED_COPY,
                        host_memory_bytes="NVIDIA DGX H100 datasheet: 2 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK,
                        contraction_latency_s=_H100_MEASURED_LATENCY,
                        conv_efficiency=_H100_MEASURED_CONV, link_latency_s=_TFLMS, launch_overhead_s=_TFLMS)),
    HardwareProfile("h100-80gb-pcie5", 80 * GIB, 51e12, 2000, 63, host_memory_bytes=1024 * GIB,
                    tf32_flops=378e12, fp16_flops=756.5e12, bf16_flops=756.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H100 80GB PCIe on PCIe 5.0 x16",
                    sources=_cite(
                        peak_flops=_H100 + ": H100 PCIe FP32 51 TFLOPS",
                        tf32_flops=_H100 + ": H100 PCIe TF32 Tensor Core 756" + _SPARSE,
                        fp16_flops=_H100 + ": H100 PCIe FP16 Tensor Core 1,513" + _SPARSE,
                        bf16_flops=_H100 + ": H100 PCIe BF16 Tensor Core 1,513" + _SPARSE,
                        memory_bytes=_H100 + ": H100 PCIe 80 GB", memory_gbps=_H100 + ": H100 PCIe 2 TB/s",
                        link_gbps=_H100 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED.replace(
                            "(same", "(the SXM5 part; the PCIe card's lower power limit may lower it; same"),
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED, host_memory_bytes=_HOST_SERVER,
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK + _ASSUMED,
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # H200 (Hopper, HBM3e): the H100 SXM's compute, 141 GB at 4.8 TB/s.
    HardwareProfile("h200-141gb", 141 * GIB, 67e12, 4800, 63, host_memory_bytes=2048 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.80, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6, link_efficiency=0.87,
                    description="NVIDIA H200 141GB SXM (HGX H200), PCIe 5.0 x16 to the host",
                    sources=_cite(
                        peak_flops=_H200 + ": H200 SXM FP32 67 TFLOPS",
                        tf32_flops=_H200 + ": H200 SXM TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_H200 + ": H200 SXM FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_H200 + ": H200 SXM BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_H200 + ": 141 GB HBM3e", memory_gbps=_H200 + ": 4.8 TB/s",
                        link_gbps=_H200 + ": PCIe Gen5 128 GB/s (both directions); " + _PCIE5,
                        contraction_efficiency=_H200_MEASURED_MM, memory_efficiency=_H200_MEASURED_COPY,
                        host_memory_bytes="NVIDIA DGX H200 datasheet: 2 TB system memory (for 8 GPUs)",
                        compute_efficiency=_TFLMS, link_efficiency=_H100_MEASURED_LINK,
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
    # GH200: an H100 with 96 GB HBM3 at 4 TB/s, NVLink-C2C (900 GB/s total) to 480 GB LPDDR5X.
    HardwareProfile("gh200", 96 * GIB, 67e12, 4000, 450, host_memory_bytes=480 * GIB,
                    tf32_flops=494.5e12, fp16_flops=989.5e12, bf16_flops=989.5e12,
                    contraction_efficiency=0.81, memory_efficiency=0.90,
                    conv_efficiency=0.210, contraction_latency_s=14.5e-6,
                    description="NVIDIA GH200 Grace Hopper: H100 96GB HBM3, NVLink-C2C to 480GB LPDDR5X",
                    sources=_cite(
                        peak_flops=_GH200 + ": FP32 67 TFLOPS",
                        tf32_flops=_GH200 + ": TF32 Tensor Core 989" + _SPARSE,
                        fp16_flops=_GH200 + ": FP16 Tensor Core 1,979" + _SPARSE,
                        bf16_flops=_GH200 + ": BF16 Tensor Core 1,979" + _SPARSE,
                        memory_bytes=_GH200 + ": 96 GB HBM3", memory_gbps=_GH200 + ": 4 TB/s",
                        link_gbps=_GH200 + ": NVLink-C2C 900 GB/s (both directions), 450 GB/s per direction",
                        contraction_efficiency=_H100_MEASURED_MM + _ASSUMED,
                        memory_efficiency=_H100_MEASURED_COPY + _ASSUMED,
                        host_memory_bytes=_GH200 + ": up to 480 GB LPDDR5X",
                        contraction_latency_s=_H100_MEASURED_LATENCY + _ASSUMED,
                        conv_efficiency=_H100_MEASURED_CONV + _ASSUMED,
                        compute_efficiency=_TFLMS, link_efficiency=_TFLMS, link_latency_s=_TFLMS,
                        launch_overhead_s=_TFLMS)),
):
    register_profile(_p)
