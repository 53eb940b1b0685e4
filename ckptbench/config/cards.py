"""The cards people train on, one table: each card's memory, CUDA context, dense tensor-core peaks and memory
bandwidth, every figure with its source (no torch).

The estimator's device model (estimator/gpus.py), the step-time model's transfer between cards
(analysis/step_time.py), the FLOP rates of a run's MFU (train/flops.py) and the help texts read this table; a card
is added here and nowhere else. A figure is *measured* only where ckptbench measured it (the H200); the others are
estimates from datasheets, device queries and published out-of-memory messages (PyTorch prints the card's total
capacity, what the process holds and what its allocator reserved: the difference is the memory outside the
allocator, the CUDA context). Tensor-core peaks are the dense figures (datasheets print the sparse ones with an
asterisk: half of them); None where the card has no such unit (no bf16 before Ampere).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ckptbench.errors import ConfigError
from ckptbench.units import GIB, parse_size


def _gib(value: float) -> int:
    return int(value * GIB)


@dataclass(frozen=True)
class Card:
    """One card and where each of its figures comes from."""

    key: str  # what --gpu takes
    name: str  # torch.cuda.get_device_name
    capability: tuple[int, int]  # CUDA compute capability
    memory_bytes: int  # torch.cuda.get_device_properties().total_memory ("total capacity" in OOM messages)
    memory_source: str
    context_bytes: int | None  # held by a training process outside the caching allocator; None: none published
    context_source: str
    bf16_tflops: float | None  # dense bf16 tensor-core peak (FP32 accumulate); None: no bf16 tensor cores
    fp16_tflops: float | None  # dense fp16 tensor-core peak (FP32 accumulate)
    flops_source: str
    bandwidth_bytes_per_s: float  # peak memory bandwidth
    bandwidth_source: str
    aliases: tuple[str, ...] = ()  # other spellings --gpu takes
    names: tuple[str, ...] = ()  # other names torch reports for the same card (another driver)
    measured: bool = False  # memory and context measured by ckptbench on this card
    notes: str = ""


CARDS: tuple[Card, ...] = (
    Card(
        "h200", "NVIDIA H200", (9, 0),
        memory_bytes=150109880320,
        memory_source=(
            "measured: results/h200-gpu-check-2/check/run.json (gpu_total_memory_bytes)"
        ),
        context_bytes=_gib(139.47 - 132.21 - 6.52),
        context_source=(
            "measured: the out-of-memory message in results/h200-gpu-check-2/gpu_check.log (139.47 GiB in use "
            "by the process, 132.21 allocated + 6.52 reserved-unallocated by PyTorch), torch 2.11, CUDA 13.0"
        ),
        bf16_tflops=989.0, fp16_tflops=989.0,
        flops_source=(
            "NVIDIA H200 datasheet: BFLOAT16/FP16 Tensor Core 1,979 TFLOPS* (with sparsity) -> 989.5 dense; "
            "Hopper whitepaper dense 989.4 at the same SXM clocks; pytorch/torchtitan torchtitan/tools/utils.py"
            " get_peak_flops uses 989e12 citing https://www.nvidia.com/en-us/data-center/h200/"
        ),
        bandwidth_bytes_per_s=4.8e+12,
        bandwidth_source=(
            "NVIDIA H200 datasheet (H200 SXM): 4.8 TB/s HBM3e; openxla/xla "
            "xla/backends/gpu/target_config/specs/h200.txtpb memory_bandwidth: 4800000000000"
        ),
        aliases=('h200-sxm', 'h200-141gb', 'nvidia-h200'),
        names=('NVIDIA H200 141GB HBM3e',),
        measured=True,
        notes=(
            "openxla/xla h200.txtpb (commit 4336d12e) records name 'NVIDIA H200 141GB HBM3e' and "
            "device_memory_size 151397597184 (141.00 GiB) under driver 13.0 - a different name string and ~1.2 "
            "GiB more than ckptbench's measured card. 'NVIDIA H200 NVL' (PCIe) is a different card (not "
            "catalogued)."
        ),
    ),
    Card(
        "h100-80gb", "NVIDIA H100 80GB HBM3", (9, 0),
        memory_bytes=_gib(79.11),
        memory_source=(
            "estimate: 'total capacity of 79.11 GiB' in a published OOM message (vllm-project/vllm#27508)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=989.0, fp16_tflops=989.0,
        flops_source=(
            "NVIDIA H100 Tensor Core GPU datasheet, spec table ('BFLOAT16/FP16 Tensor Core: H100 SXM 1,979 "
            "TFLOPS*, H100 PCIe 1,513 TFLOPS*; * with sparsity, specifications 1/2 lower without'), table "
            "reproduced at https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html; dense values of the "
            "NVIDIA Hopper architecture whitepaper (GTC22), table 'H100 SXM5 / PCIe': BF16 989.4 / 756 dense "
            "(also https://glennklockwood.com/garden/processors/h100: BF16 matrix 989.4, sparse 1978.9)"
        ),
        bandwidth_bytes_per_s=3.35e+12,
        bandwidth_source=(
            "NVIDIA H100 datasheet (H100 SXM): GPU memory bandwidth 3.35 TB/s (hpctech.co.jp table: 3,350 "
            "GB/sec); openxla/xla xla/backends/gpu/target_config/specs/h100_sxm.txtpb memory_bandwidth "
            "3352320000000"
        ),
        aliases=('h100-sxm', 'h100-sxm5', 'h100-sxm-80gb', 'h100-hbm3'),
        notes=(
            " H800 (China SXM variant, name 'NVIDIA H800') has the same tensor rate in NVIDIA's material but no"
            " torch total/name output was found, so it is not catalogued."
        ),
    ),
    Card(
        "h100-pcie", "NVIDIA H100 PCIe", (9, 0),
        memory_bytes=84943044608,
        memory_source=(
            "estimate: a published output (search index id 33356850601): '_CudaDeviceProperties(name='NVIDIA "
            "H100 PCIe', major=9, minor=0, total_memory=81008MB, multi_processor_count=114)' (torch prints "
            "total_memory // 2**20, so bytes are in [81008, 81009) MiB; 81008 MiB = 79.11 GiB). openxla/xla "
            "xla/backends/gpu/target_config/specs/h100_pcie.txtpb gives 84942979072 B (identical to its SXM "
            "file, possibly copied)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=756.0, fp16_tflops=756.0,
        flops_source=(
            "NVIDIA H100 Tensor Core GPU datasheet, spec table ('BFLOAT16/FP16 Tensor Core: H100 SXM 1,979 "
            "TFLOPS*, H100 PCIe 1,513 TFLOPS*; * with sparsity, specifications 1/2 lower without'), table "
            "reproduced at https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html; dense values of the "
            "NVIDIA Hopper architecture whitepaper (GTC22), table 'H100 SXM5 / PCIe': BF16 989.4 / 756 dense "
            "(also https://glennklockwood.com/garden/processors/h100: BF16 matrix 989.4, sparse 1978.9); "
            "Lightning throughput.py 'h100 pcie' 756e12; torchtitan 756e12"
        ),
        bandwidth_bytes_per_s=2e+12,
        bandwidth_source=(
            "NVIDIA H100 datasheet (H100 PCIe): 2 TB/s (hpctech.co.jp table: 2000 GB/sec; H100 PCIe product "
            "brief PB-11133: 'greater than 2,000 gigabytes per second'). deviceQuery-style outputs compute "
            "2039.04 GB/s from 1593 MHz x 5120 bit (a published output (search index id 12771033864) and "
            "31353373741; openxla/xla xla/backends/gpu/target_config/specs/h100_pcie.txtpb 2039040000000)"
        ),
        aliases=('h100-pcie-80gb', 'h100pcie'),
        notes=(
            "Name string also confirmed by the Slovenian course notes (find_string id 12771033864: '======= "
            "Device 0: \"NVIDIA H100 PCIe\"', Hopper 9.0, 114 SMs)."
        ),
    ),
    Card(
        "h100-nvl", "NVIDIA H100 NVL", (9, 0),
        memory_bytes=99861594112,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/H100NVLx2_deviceQuery.py: 'NVIDIA "
            "H100 NVL', 9.0, Total amount of global memory 95235 MBytes (99861594112 bytes) = 93.00 GiB, driver"
            " 12.4 (550.54.14; nvidia-smi 95830MiB)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=835.5, fp16_tflops=835.5,
        flops_source=(
            "NVIDIA H100 datasheet (current edition, H100 NVL column): BFLOAT16/FP16 Tensor Core 1,671 TFLOPS* "
            "(with sparsity) -> 835.5 dense; torchtitan get_peak_flops returns 835e12 for 'NVL' citing "
            "https://www.nvidia.com/en-us/data-center/h100/. Caution: Lightning throughput.py 'h100 nvl' = "
            "1978.8e12 is the older per-pair (2-GPU) figure"
        ),
        bandwidth_bytes_per_s=3.9e+12,
        bandwidth_source=(
            "NVIDIA H100 datasheet (H100 NVL): 3.9 TB/s HBM3 (https://grokipedia.com/page/210100120: 3.93 TB/s,"
            " 94 GB HBM3)"
        ),
        aliases=('h100nvl', 'h100-nvl-94gb'),
        notes="94 GB HBM3 per GPU; sold as NVLink-bridged pairs. PCIe card (350-400 W).",
    ),
    Card(
        "gh200", "NVIDIA GH200 480GB", (9, 0),
        memory_bytes=101876624261,
        memory_source=(
            "estimate: 'GPU 0 has a total capacity of 94.88 GiB' in a published OOM message, "
            "Lightning-AI/litgpt#1892 (nvidia-smi there: 97871 MiB)"
        ),
        context_bytes=794568950,
        context_source=(
            "estimate: same message (litgpt#1892): 94.69 GiB in use by the process, 91.40 GiB allocated + 2.55 "
            "GiB reserved-unallocated by PyTorch -> 0.74 GiB"
        ),
        bf16_tflops=989.4, fp16_tflops=989.4,
        flops_source=(
            "NVIDIA GH200 Grace Hopper Superchip datasheet: FP16/BFLOAT16 Tensor Core 1,979 TFLOPS* (with "
            "sparsity) -> ~989 dense (same Hopper GPU as H100 SXM; datasheet not retrieved in this session - "
            "figure is the H100 SXM figure the datasheet repeats)"
        ),
        bandwidth_bytes_per_s=4e+12,
        bandwidth_source=(
            "NVIDIA GH200 datasheet, 96GB HBM3 configuration: 4 TB/s (datasheet not retrieved here; consistent "
            "with a measured 3614.60 GB/s coalesced read in mredenti/PowerCapping "
            "configuration/OpenCL_benchmark.md on an 'NVIDIA GH200 480GB')"
        ),
        aliases=('gh200-480gb', 'gh200-96gb', 'grace-hopper'),
    ),
    Card(
        "h20", "NVIDIA H20", (9, 0),
        memory_bytes=102091372626,
        memory_source=(
            "estimate: 'GPU 0 has a total capacity of 95.08 GiB' in sgl-project/sglang#10736 (single H20). "
            "Another driver: a published output (search index id 16061001073) (comment in a Triton kernel "
            "file): '_CudaDeviceProperties(name='NVIDIA H20', major=9, minor=0, total_memory=97285MB, "
            "multi_processor_count=78)' = 95.00 GiB"
        ),
        context_bytes=466637292,
        context_source=(
            "estimate: same message (sglang#10736): 93.27 GiB in use by the process, 92.83 GiB allocated + 5.54"
            " MiB reserved-unallocated -> 0.43 GiB (sglang process)"
        ),
        bf16_tflops=148.0, fp16_tflops=148.0,
        flops_source=(
            "NO official NVIDIA datasheet is public for H20. 148 TFLOPS FP16/BF16 dense is the widely reported "
            "spec: https://willitrunai.com/es/gpus/h20-96gb ('148 TFLOPS FP16'), "
            "https://zangshuxian.com/new/674733024499207168 ('FP16稠密算力为148TFLOPS'); TweakTown "
            "https://www.tweaktown.com/news/95224/nvidias-tweaked-h20-ai-gpu-enters-mass-production-in-q2-2024-destined-for-china/index.html"
            " quotes 296 TFLOPs (the FP8/INT8 figure). Treat as unofficial."
        ),
        bandwidth_bytes_per_s=4e+12,
        bandwidth_source=(
            "unofficial: 96 GB HBM3 at 4.0 TB/s per TweakTown "
            "(https://www.tweaktown.com/news/95224/nvidias-tweaked-h20-ai-gpu-enters-mass-production-in-q2-2024-destined-for-china/index.html)"
            " and "
            "https://tweakers.net/nieuws/215984/nvidia-stelt-release-ai-chip-voor-chinese-markt-uit-naar-begin-2024.html"
        ),
        aliases=('h20-96gb', 'nvidia-h20'),
        notes=(
            "China-market Hopper (78 SMs). Compute-starved relative to memory: step times will be FLOP-bound "
            "much earlier than on H100."
        ),
    ),
    Card(
        "b200", "NVIDIA B200", (10, 0),
        memory_bytes=191514411008,
        memory_source=(
            "estimate: openxla/xla xla/backends/gpu/target_config/specs/b200.txtpb (commit 300ec95a): name "
            "'NVIDIA B200', device_memory_size 191514411008 (178.36 GiB), ecc_enabled, driver 13.0, runtime "
            "12.8"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=2250.0, fp16_tflops=2250.0,
        flops_source=(
            "NVIDIA Blackwell datasheet (nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703), HGX B200: "
            "FP16/BF16 Tensor Core 36 PFLOPS* per 8 GPUs with sparsity -> 2.25 PFLOPS dense per GPU (datasheet "
            "not retrieved here); torchtitan get_peak_flops returns 2.25e15 for 'B200' citing that datasheet"
        ),
        bandwidth_bytes_per_s=8e+12,
        bandwidth_source=(
            "NVIDIA HGX B200 datasheet: 8 TB/s per GPU (64 TB/s per 8-GPU board; not retrieved here). "
            "openxla/xla xla/backends/gpu/target_config/specs/b200.txtpb memory_bandwidth 7672320000000 "
            "(computed from the 3996 MHz memory clock)"
        ),
        aliases=('b200-sxm', 'hgx-b200', 'nvidia-b200'),
    ),
    Card(
        "a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0),
        memory_bytes=_gib(79.25),
        memory_source=(
            "estimate: '79.25 GiB total capacity' in a published OOM message (levihsu/OOTDiffusion#235)"
        ),
        context_bytes=_gib(79.27 - 74.53 - 4.23),
        context_source=(
            "estimate: a published A800-80GB OOM message (hahnyuan/PB-LLM#3): 79.27 GiB in use, 74.53 + 4.23 "
            "reserved by PyTorch"
        ),
        bf16_tflops=312.0, fp16_tflops=312.0,
        flops_source=(
            "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), spec table: "
            "BFLOAT16/FP16 Tensor Core 312 TFLOPS | 624 TFLOPS* (* with sparsity) -> 312 dense, same for SXM "
            "and PCIe (also Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py "
            "_CUDA_FLOPS 'a100', facebookresearch/xformers xformers/profiler/device_limits.py 'A100')"
        ),
        bandwidth_bytes_per_s=2.039e+12,
        bandwidth_source=(
            "NVIDIA A100 datasheet (A100 80GB SXM): 2,039 GB/s HBM2e; openxla/xla "
            "xla/backends/gpu/target_config/specs/a100_sxm_80.txtpb 2039040000000"
        ),
        aliases=('a100-sxm-80gb', 'a100-sxm4-80gb', 'a100-80gb-sxm'),
        notes=(
            "A800-SXM4-80GB (China variant, name 'NVIDIA A800-SXM4-80GB' per a test fixture, find_string id "
            "60650718188) has the same compute/memory; no torch total found."
        ),
    ),
    Card(
        "a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0),
        memory_bytes=_gib(39.50),
        memory_source=(
            "estimate: 'total capacity of 39.50 GiB' in a published OOM message (TianheWu/CoSeR#10)"
        ),
        context_bytes=_gib(14.25 - 12.87 - 912.01 / 1024),
        context_source=(
            "estimate: the same message: 14.25 GiB in use, 12.87 GiB + 912.01 MiB reserved by PyTorch"
        ),
        bf16_tflops=312.0, fp16_tflops=312.0,
        flops_source=(
            "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), spec table: "
            "BFLOAT16/FP16 Tensor Core 312 TFLOPS | 624 TFLOPS* (* with sparsity) -> 312 dense, same for SXM "
            "and PCIe (also Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py "
            "_CUDA_FLOPS 'a100', facebookresearch/xformers xformers/profiler/device_limits.py 'A100')"
        ),
        bandwidth_bytes_per_s=1.555e+12,
        bandwidth_source=(
            "NVIDIA A100 datasheet (A100 40GB SXM): 1,555 GB/s HBM2; openxla/xla "
            "xla/backends/gpu/target_config/specs/a100_sxm_40.txtpb 1555200000000"
        ),
        aliases=('a100-sxm-40gb', 'a100-sxm4-40gb'),
        notes="Newer drivers report ~80 MiB less than the 39.50 GiB OOM figure.",
    ),
    Card(
        "a100-pcie-80gb", "NVIDIA A100 80GB PCIe", (8, 0),
        memory_bytes=84974239744,
        memory_source=(
            "estimate: a published output (search index id 5676699412) (an HPC cluster's 'Cluster GPU Overview'"
            " docs, deviceQuery on gpu-a100-0[1-2]): '\"NVIDIA A100 80GB PCIe\" ... 8.0 ... 81038 MBytes "
            "(84974239744 bytes)', driver 12.4 = 79.14 GiB (matches 'total capacity of 79.14 GiB' in "
            "lianqi1008/Control-GIC#6). Older driver: honcharov-danylo/llm_project cluster_tools/README.md "
            "HTCondor 'NVIDIA A100 80GB PCIe 12.0 8.0 81085' (MiB)"
        ),
        context_bytes=527580529,
        context_source=(
            "estimate: lianqi1008/Control-GIC#6 (80 GB A100, total 79.14 GiB = the PCIe card's total): 9.25 GiB"
            " in use, 8.27 GiB allocated + 500.38 MiB reserved-unallocated -> 0.49 GiB (card type inferred from"
            " the total)"
        ),
        bf16_tflops=312.0, fp16_tflops=312.0,
        flops_source=(
            "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), spec table: "
            "BFLOAT16/FP16 Tensor Core 312 TFLOPS | 624 TFLOPS* (* with sparsity) -> 312 dense, same for SXM "
            "and PCIe (also Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py "
            "_CUDA_FLOPS 'a100', facebookresearch/xformers xformers/profiler/device_limits.py 'A100')"
        ),
        bandwidth_bytes_per_s=1.935e+12,
        bandwidth_source=(
            "NVIDIA A100 datasheet (A100 80GB PCIe): 1,935 GB/s HBM2e (datasheet r4, not retrieved here; the "
            "same figure appears in a public GPU table, find_string id 24041598087 "
            "'memory_bandwidth_gbps=1935')"
        ),
        aliases=('a100-80gb-pcie', 'a100-pcie'),
        notes="Note the name format differs from the SXM parts ('A100 80GB PCIe' vs 'A100-SXM4-80GB').",
    ),
    Card(
        "a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", (8, 0),
        memory_bytes=42285268992,
        memory_source=(
            "estimate: a published output (search index id 5676699412) (same cluster docs, gpu-a100-0[3-4]): "
            "'\"NVIDIA A100-PCIE-40GB\" ... 8.0 ... 40326 MBytes (42285268992 bytes)', driver 12.4 = 39.38 GiB"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=312.0, fp16_tflops=312.0,
        flops_source=(
            "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), spec table: "
            "BFLOAT16/FP16 Tensor Core 312 TFLOPS | 624 TFLOPS* (* with sparsity) -> 312 dense, same for SXM "
            "and PCIe (also Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py "
            "_CUDA_FLOPS 'a100', facebookresearch/xformers xformers/profiler/device_limits.py 'A100')"
        ),
        bandwidth_bytes_per_s=1.555e+12,
        bandwidth_source=(
            "NVIDIA A100 datasheet (A100 40GB PCIe): 1,555 GB/s HBM2 (xformers device_limits.py: 'PCIe is 1.5 "
            "TB/s')"
        ),
        aliases=('a100-40gb-pcie', 'a100-pcie4-40gb'),
    ),
    Card(
        "a30", "NVIDIA A30", (8, 0),
        memory_bytes=25228738560,
        memory_source=(
            "estimate: JakeFlasher/benchmark_flash_attention results_kvcache/window-4096.md (nvbench): '[0] "
            "`NVIDIA A30`, SM Version 800, Global Memory: 23805 MiB Free / 24060 MiB Total, ECC Enabled' = "
            "23.50 GiB (google/RB-Modulation#5 OOM says 23.53 GiB)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=165.0, fp16_tflops=165.0,
        flops_source=(
            "NVIDIA A30 datasheet (a30-datasheet.pdf): BF16/FP16 Tensor Core 165 TFLOPS | 330 TFLOPS* -> 165 "
            "dense; facebookresearch/xformers xformers/profiler/device_limits.py 'A30' bf16 165 citing that "
            "datasheet"
        ),
        bandwidth_bytes_per_s=9.33e+11,
        bandwidth_source=(
            "NVIDIA A30 datasheet: 933 GB/s HBM2 (xformers device_limits.py 'A30'; nvbench 'Global Memory Bus "
            "Peak: 933 GB/sec' in the same JakeFlasher file)"
        ),
        aliases=('a30-24gb', 'nvidia-a30'),
    ),
    Card(
        "a10", "NVIDIA A10", (8, 6),
        memory_bytes=23609475072,
        memory_source=(
            "estimate: aalanwyr/face2cuda step2cuda/README.md (device query): 'NVIDIA A10', 8.6, 21.99 GBytes "
            "(23609475072 bytes), driver 12.2; matches 'total capacty of 21.99 GiB' in zai-org/CogVLM#236 "
            "(Lambda A10)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=125.0, fp16_tflops=125.0,
        flops_source=(
            "NVIDIA A10 datasheet (a10-datasheet.pdf): BF16/FP16 Tensor Core 125 TFLOPS | 250 TFLOPS* -> 125 "
            "dense (Lightning throughput.py 'a10g' entry reuses these A10 datasheet numbers)"
        ),
        bandwidth_bytes_per_s=6e+11,
        bandwidth_source=(
            "NVIDIA A10 datasheet: 600 GB/s GDDR6 (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference: "
            "24 GB GDDR6, 600 GB/s)"
        ),
        aliases=('a10-24gb', 'nvidia-a10'),
        notes="Lambda/Oracle/Azure card. Not the AWS A10G.",
    ),
    Card(
        "a10g", "NVIDIA A10G", (8, 6),
        memory_bytes=23684186112,
        memory_source=(
            "estimate: a published output (search index id 67234836605): torch 2.15.0.dev (cu130) "
            "'_CudaDeviceProperties(name='NVIDIA A10G', major=8, minor=6, total_memory=22587MB, "
            "multi_processor_count=80, ...)' = 22.06 GiB (recent driver). Older driver: a published output "
            "(search index id 7882622645) (YOLOv3 training log) 'NVIDIA A10G', total_memory=22723MB = 22.19 GiB"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=None, fp16_tflops=None,
        flops_source=(
            "NO official NVIDIA/AWS tensor figure for the A10G was found. Lightning's 'a10g' 125 TFLOPS is the "
            "A10 datasheet value; baseten (blog above) says the A10 'prioritizes tensor compute' vs the A10G; a"
            " published cuBLAS burn-in on an A10G measured 67.1 TFLOPS (fp16-in/fp32-acc, a published output "
            "(search index id 59916716275), i.e. well below 125 - so 125 would overstate it. Left None."
        ),
        bandwidth_bytes_per_s=6e+11,
        bandwidth_source=(
            "secondary: baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference ('A10 and A10G share ... 24 "
            "GB GDDR6 ... 600 GB/s'); no AWS/NVIDIA datasheet figure found"
        ),
        aliases=('a10g-24gb', 'aws-g5', 'nvidia-a10g'),
        notes="AWS g5 instances. 80 SMs (vs A10's 72).",
    ),
    Card(
        "a40", "NVIDIA A40", (8, 6),
        memory_bytes=47608692736,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/A40x10_deviceQuery.py: 'NVIDIA "
            "A40', 8.6, 45403 MBytes (47608692736 bytes) = 44.34 GiB, ECC Enabled, driver 12.4 (550.127.05, "
            "nvidia-smi 46068MiB); older driver: honcharov-danylo/llm_project cluster_tools/README.md 'NVIDIA "
            "A40 12.0 8.6 45466'"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=149.7, fp16_tflops=149.7,
        flops_source=(
            "NVIDIA A40 datasheet: Peak BF16 Tensor TFLOPS with FP32 Accumulate 149.7 | 299.4* (and FP16 149.7 "
            "| 299.4*) -> 149.7 dense; table reproduced at "
            "https://www.ecer.com/corp/details-uuuedqa-p1bsay9-multi-display-setups-supported-by-48gb-gddr6-ecc-memory-nvidia-a40-gpu-and-vga-outputs.html."
            " Caution: Lightning's 'a40' bf16 37.4e12 is the non-tensor rate"
        ),
        bandwidth_bytes_per_s=6.96e+11,
        bandwidth_source=(
            "NVIDIA A40 datasheet: 696 GB/s GDDR6 with ECC (same ecer.com reproduction)"
        ),
        aliases=('a40-48gb', 'nvidia-a40'),
        notes="ECC is on by default (nvidia-smi 46068MiB); with ECC off the total is ~3 GiB larger.",
    ),
    Card(
        "l40s", "NVIDIA L40S", (8, 9),
        memory_bytes=_gib(44.42),
        memory_source=(
            "estimate: 'total capacity of 44.42 GiB' in a published OOM message (stepfun-ai/Step-Video-T2V#8)"
        ),
        context_bytes=_gib(44.29 - 43.88),
        context_source=(
            "estimate: the same message: 44.29 GiB in use, 43.88 GiB reserved by PyTorch"
        ),
        bf16_tflops=362.05, fp16_tflops=362.05,
        flops_source=(
            "NVIDIA L40S datasheet: BFLOAT16/FP16 Tensor Core 362.05 | 733* TFLOPS -> 362.05 dense; L40/L40S "
            "datasheet table reproduced at https://www.mullet.se/product.html?product_id=355414; torchtitan "
            "362e12 citing resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
        ),
        bandwidth_bytes_per_s=8.64e+11, bandwidth_source="NVIDIA L40S datasheet: 864 GB/s GDDR6 with ECC",
        aliases=('l40s-48gb', 'nvidia-l40s'),
    ),
    Card(
        "l40", "NVIDIA L40", (8, 9),
        memory_bytes=47674136986,
        memory_source=(
            "estimate: 'GPU 0 has a total capacity of 44.40 GiB' in QwenLM/Qwen3-VL#2097 (single L40; same "
            "report NVlabs/Eagle#68)"
        ),
        context_bytes=531229573,
        context_source=(
            "estimate: same message: 11.13 GiB in use, 10.25 GiB allocated + 394.50 MiB reserved-unallocated ->"
            " 0.49 GiB (torch with CUDA 12.8/13 wheels)"
        ),
        bf16_tflops=181.05, fp16_tflops=181.05,
        flops_source=(
            "NVIDIA L40 datasheet: BFLOAT16/FP16 Tensor Core 181.05 | 362.1* TFLOPS -> 181.05 dense (mullet.se "
            "reproduction of the L40/L40S table); Lightning 'l40' 181e12"
        ),
        bandwidth_bytes_per_s=8.64e+11,
        bandwidth_source=(
            "NVIDIA L40 datasheet: 864 GB/s GDDR6 with ECC (mullet.se reproduction)"
        ),
        aliases=('l40-48gb', 'nvidia-l40'),
        notes=(
            "Name 'NVIDIA L40' from nvidia-smi tables (find_string ids 21580086933, 52496202912; nvidia-smi and"
            " torch read the same driver name; not truncated at this length). capability 8.9 = Ada (AD102), by "
            "architecture. ECC on: nvidia-smi 46068MiB; ECC off: 49140MiB."
        ),
    ),
    Card(
        "l4", "NVIDIA L4", (8, 9),
        memory_bytes=23570219008,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/L4_deviceQuery.py: 'NVIDIA L4', "
            "8.9, 22478 MBytes (23570219008 bytes) = 21.95 GiB, ECC Enabled, driver 12.4; older driver 12.0: "
            "22518 MBytes (23612293120 bytes), a published output (search index id 45267014195)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=121.0, fp16_tflops=121.0,
        flops_source=(
            "NVIDIA L4 datasheet: FP16/BF16 Tensor Core 242 TFLOPS* (with sparsity) -> 121 dense "
            "(https://grokipedia.com/page/NVIDIA_L4_vs_L40S quotes 242 with sparsity); Lightning 'l4' 121e12"
        ),
        bandwidth_bytes_per_s=3e+11,
        bandwidth_source=(
            "NVIDIA L4 datasheet: 300 GB/s GDDR6 (store.sourcecode.com compare table 'Max Memory Bandwidth 300 "
            "GB/s')"
        ),
        aliases=('l4-24gb', 'nvidia-l4', 'gcp-g2'),
        notes="GCP g2 instances. 72 W card: sustained clocks can sit well below boost, so the peak is optimistic.",
    ),
    Card(
        "a6000", "NVIDIA RTX A6000", (8, 6),
        memory_bytes=51041271808,
        memory_source=(
            "estimate: openxla/xla xla/backends/gpu/target_config/specs/a6000.txtpb (commit 4336d12e): "
            "device_description_str 'NVIDIA RTX A6000', compute capability 8.6, device_memory_size 51041271808 "
            "(47.54 GiB)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=154.8, fp16_tflops=154.8,
        flops_source=(
            "NVIDIA Ampere GA102 GPU architecture whitepaper "
            "(nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf), appendix tables: RTX A6000 Peak BF16 / "
            "FP16 Tensor TFLOPS with FP32 Accumulate 154.8 | 309.7* -> 154.8 dense (workstation parts run FP32 "
            "accumulate at full rate); https://llmperf.net/categories/gpu/Nvidia-A6000-GPUs (citing Microway): "
            "'154.8 TFLOPS FP16/BF16 dense, 309.7 with sparsity'. Caution: Lightning's 'a6000' bf16 38.7e12 is "
            "the non-tensor rate"
        ),
        bandwidth_bytes_per_s=7.68e+11,
        bandwidth_source=(
            "NVIDIA RTX A6000 datasheet: 768 GB/s GDDR6 (openxla/xla "
            "xla/backends/gpu/target_config/specs/a6000.txtpb memory_bandwidth 768096000000)"
        ),
        aliases=('rtx-a6000', 'rtxa6000', 'a6000-48gb'),
        notes=(
            "ECC off by default on this card (47.54 GiB); with ECC on the total drops by ~3 GiB (compare RTX "
            "6000 Ada)."
        ),
    ),
    Card(
        "rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", (8, 9),
        memory_bytes=51002867712,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/RTX6000Ada_x8_deviceQuery.py: "
            "'NVIDIA RTX 6000 Ada Generation', 8.9, 48640 MBytes (51002867712 bytes) = 47.50 GiB, ECC Disabled,"
            " driver 12.4. With ECC enabled: 'total capacity of 44.43 GiB' in DINGYANB/MTVCrafter#21 "
            "(nvidia-smi 46068MiB)"
        ),
        context_bytes=449933476,
        context_source=(
            "estimate: DINGYANB/MTVCrafter#21: 44.40 GiB in use, 43.94 GiB allocated + 41.95 MiB "
            "reserved-unallocated -> 0.42 GiB"
        ),
        bf16_tflops=364.2, fp16_tflops=364.2,
        flops_source=(
            "NVIDIA Ada GPU architecture whitepaper (nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf), appendix"
            " table: RTX 6000 Ada Peak FP16/BF16 Tensor TFLOPS with FP32 Accumulate 364.2 | 728.5* -> 364.2 "
            "dense (whitepaper not retrieved in this session; equals the datasheet's 1,457 TFLOPS FP8-sparse / "
            "4)"
        ),
        bandwidth_bytes_per_s=9.6e+11,
        bandwidth_source=(
            "NVIDIA RTX 6000 Ada datasheet: 960 GB/s GDDR6 (not retrieved in this session)"
        ),
        aliases=('rtx6000-ada', '6000-ada', 'rtx-6000-ada-generation'),
        notes="Total depends on ECC: 47.50 GiB off / 44.43 GiB on.",
    ),
    Card(
        "rtx-4090", "NVIDIA GeForce RTX 4090", (8, 9),
        memory_bytes=25386352640,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/RTX4090_deviceQuery.py: 'NVIDIA "
            "GeForce RTX 4090', 8.9, 24210 MBytes (25386352640 bytes) = 23.64 GiB, driver 12.4 (Linux); agrees "
            "with 'total capacity of 23.64 GiB' in ali-vilab/VGen#104, 3DTopia/Phidias-Diffusion#8, "
            "deepseek-ai/DeepSeek-V3#205. Windows reports more (24563 MiB, a published output (search index id "
            "7862287914); older drivers 23.65-23.68 GiB (TRI-ML/packnet-sfm#250, zai-org/CogVideo#36)"
        ),
        context_bytes=528062874,
        context_source=(
            "estimate: 3DTopia/Phidias-Diffusion#8: 14.56 GiB in use, 13.86 GiB allocated + 213.20 MiB "
            "reserved-unallocated -> 0.49 GiB (pinokiofactory/flux-webui#11 gives 0.46 GiB; ali-vilab/VGen#104 "
            "gives 2.15 GiB with extra libraries loaded)"
        ),
        bf16_tflops=165.2, fp16_tflops=165.2,
        flops_source=(
            "NVIDIA Ada GPU architecture whitepaper (nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf), appendix"
            " table: RTX 4090 Peak FP16 and BF16 Tensor TFLOPS with FP32 Accumulate 165.2 | 330.4* (FP16 with "
            "FP16 accumulate 330.3 | 660.6*) -> 165.2 dense with FP32 accumulate, which is what PyTorch's "
            "bf16/fp16 GEMMs use; corroborated by https://gigagpu.com/?p=34220 ('BF16 / FP16 (FP32 accum) 165.2"
            " dense') and waredb.com. Caution: Lightning's 'rtx 4090' 82.6e12 is the non-tensor rate"
        ),
        bandwidth_bytes_per_s=1.008e+12,
        bandwidth_source=(
            "NVIDIA RTX 4090 specifications: 1,008 GB/s GDDR6X (waredb.com/processor/nvidia-geforce-rtx-4090: "
            "1008 GB/s)"
        ),
        aliases=('4090', 'rtx4090', 'geforce-rtx-4090'),
        notes=(
            "fp16_dense_tflops is the FP32-accumulate rate; with FP16 accumulate (not used by PyTorch matmuls "
            "by default) it is 330.3. Display-attached/Windows cards report more total but lose some to the "
            "desktop."
        ),
    ),
    Card(
        "rtx-3090", "NVIDIA GeForce RTX 3090", (8, 6),
        memory_bytes=25327697920,
        memory_source=(
            "estimate: thamada/nvidia-smi (commit c4c8a463, 2024-11-15) gls/RTX3090_deviceQuery.py: 'NVIDIA "
            "GeForce RTX 3090', 8.6, 24154 MBytes (25327697920 bytes) = 23.59 GiB, driver 12.6; agrees with "
            "'total capacity of 23.59 GiB' in bytedance/X-Portrait#7. Other drivers: "
            "Jumperkables/cuda-benchmarking 00_deviceQuery/README.md 25286672384 B (23.55 GiB, desktop); older "
            "23.68-23.70 GiB (GaoLii/DSP#10, wutong16/HyperDreamer#4)"
        ),
        context_bytes=318672732,
        context_source=(
            "estimate: bytedance/X-Portrait#7: 20.50 GiB in use, 20.02 GiB allocated + 187.61 MiB "
            "reserved-unallocated -> 0.30 GiB"
        ),
        bf16_tflops=71.0, fp16_tflops=71.0,
        flops_source=(
            "NVIDIA Ampere GA102 GPU architecture whitepaper "
            "(nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf), appendix tables: RTX 3090 Peak FP16 "
            "Tensor TFLOPS with FP16 Accumulate 142 | 284*, with FP32 Accumulate 71 | 142*, BF16 with FP32 "
            "Accumulate 71 | 142* -> 71 dense (whitepaper not retrieved here; holynerdvana.blogspot.com 2022/10"
            " spec table 'FP16 TFLOPS (Sparsity) 142 (285)' = FP16-accumulate figure; the FP32-accumulate half "
            "rate on GA10x GeForce: https://gist-raw.zthxxx.me/getianao/33fb5306ba896193c7ae59ec64794283). "
            "Caution: Lightning's 'rtx 3090' 35.6e12 is the non-tensor rate"
        ),
        bandwidth_bytes_per_s=9.36e+11,
        bandwidth_source=(
            "NVIDIA RTX 3090 specifications: 936 GB/s GDDR6X "
            "(holynerdvana.blogspot.com/2022/10/nvidia-geforce-rtx-3090-specifications.html 'Bandwidth (GB/s) "
            "936')"
        ),
        aliases=('3090', 'rtx3090', 'geforce-rtx-3090'),
        notes=(
            "fp16 with FP16 accumulate: 142 dense. RTX 3090 Ti (1008 GB/s, 80 FP32-acc TFLOPS per the "
            "whitepaper) not catalogued."
        ),
    ),
    Card(
        "rtx-5090", "NVIDIA GeForce RTX 5090", (12, 0),
        memory_bytes=33660534784,
        memory_source=(
            "estimate: a published output (search index id 56722329390) (a GEMM-kernel README): deviceQuery "
            "'\"NVIDIA GeForce RTX 5090\" ... CUDA Driver 13.0 ... Capability 12.0 ... 32101 MBytes (33660534784 "
            "bytes)' = 31.35 GiB; another driver 33668857856 B (id 55094177048); Wan-Video/Wan2.1#465 OOM: "
            "31.37 GiB"
        ),
        context_bytes=623892234,
        context_source=(
            "estimate: Wan-Video/Wan2.1#465: 31.34 GiB in use, 30.74 GiB allocated + 19.41 MiB "
            "reserved-unallocated -> 0.58 GiB"
        ),
        bf16_tflops=209.5, fp16_tflops=209.5,
        flops_source=(
            "DERIVED, flag it: NVIDIA quotes FP16 Tensor 838.4 TFLOPS (sparse, FP16 accumulate) - "
            "spheron.network/blog/nvidia-rtx-5090-specs, Linux Format May 2025 ('838 FP16'); /2 for sparsity /2"
            " for FP32 accumulate on GeForce (half rate, as on Ada/Ampere GeForce and measured on a consumer "
            "Blackwell RTX 5060 Ti in QuantumDrizzy/BLACKWALL) = 209.6; the NVIDIA RTX Blackwell GPU "
            "architecture whitepaper lists 209.5 (not retrieved here). A cuBLAS GEMM on a 5090 measured 182.68 "
            "TFLOPS (same file as the deviceQuery), consistent with it"
        ),
        bandwidth_bytes_per_s=1.792e+12,
        bandwidth_source=(
            "NVIDIA RTX 5090 specifications: 1,792 GB/s GDDR7 512-bit "
            "(spheron.network/blog/nvidia-rtx-5090-specs; Linux Format May 2025 'Bandwidth 1,792GB/s')"
        ),
        aliases=('5090', 'rtx5090', 'geforce-rtx-5090'),
        notes="sm_120 (consumer Blackwell, not the B200's sm_100). fp16 with FP16 accumulate: ~419 dense.",
    ),
    Card(
        "v100-32gb", "Tesla V100-SXM2-32GB", (7, 0),
        memory_bytes=34072559616,
        memory_source=(
            "estimate: a published output (search index id 27429801100) (hands-on course README): deviceQuery "
            "'\"Tesla V100-SXM2-32GB\" ... 12.9 / 12.9 ... 7.0 ... 32494 MBytes (34072559616 bytes)' = 31.73 GiB;"
            " older drivers 34089730048 B (11.2/11.4, id 3776047195); OOMs: 31.74 GiB "
            "(liucongg/ChatGLM-Finetuning#73), 31.75 GiB (uni-medical/SAM-Med3D#8)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=None, fp16_tflops=125.0,
        flops_source=(
            "NVIDIA V100 datasheet (volta-v100-datasheet-update-us-1165301-r5.pdf): Tensor Performance 125 "
            "TFLOPS (V100 SXM2); no BF16 on Volta. Lightning 'v100 sxm' fp16 125e12 and xformers 'V100' 125 "
            "cite that datasheet"
        ),
        bandwidth_bytes_per_s=9e+11,
        bandwidth_source=(
            "NVIDIA V100 datasheet: 900 GB/s HBM2 (xformers device_limits.py 'V100'; openxla/xla "
            "xla/backends/gpu/target_config/specs/v100.txtpb memory_bandwidth 898048000000 computed)"
        ),
        aliases=('v100-sxm2-32gb', 'v100-32g'),
        notes="No bf16: training runs in fp16 with loss scaling (or fp32).",
    ),
    Card(
        "v100-16gb", "Tesla V100-SXM2-16GB", (7, 0),
        memory_bytes=16935682048,
        memory_source=(
            "estimate: openxla/xla xla/backends/gpu/target_config/specs/v100.txtpb (commit 4336d12e): name "
            "'Tesla V100-SXM2-16GB', device_memory_size 16935682048 (15.77 GiB), driver 13.0; OOM 'total "
            "capacity 15.78 GiB' in kchengiva/Shift-GCN#34 (16G V100)"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=None, fp16_tflops=125.0, flops_source="NVIDIA V100 datasheet: 125 TFLOPS tensor (SXM2); no BF16",
        bandwidth_bytes_per_s=9e+11, bandwidth_source="NVIDIA V100 datasheet: 900 GB/s HBM2",
        aliases=('v100-sxm2-16gb', 'v100-16g'),
        notes="AWS p3 card. Bare 'v100' is listed as ambiguous (card_aliases_ambiguous.json).",
    ),
    Card(
        "v100-pcie-32gb", "Tesla V100-PCIE-32GB", (7, 0),
        memory_bytes=34072559616,
        memory_source=(
            "estimate: a published output (search index id 5676699412) (same cluster docs): deviceQuery '\"Tesla"
            " V100-PCIE-32GB\" ... 7.0 ... 32494 MBytes (34072559616 bytes)', driver 12.4"
        ),
        context_bytes=None, context_source="",
        bf16_tflops=None, fp16_tflops=112.0,
        flops_source=(
            "NVIDIA V100 datasheet: Tensor Performance 112 TFLOPS (V100 PCIe); Lightning 'v100 pcie' 112e12"
        ),
        bandwidth_bytes_per_s=9e+11, bandwidth_source="NVIDIA V100 datasheet: 900 GB/s HBM2 (PCIe and SXM2 alike)",
        aliases=('v100-pcie', 'v100-pcie-32g'),
        notes="V100S (130 TFLOPS, 1134 GB/s, name 'Tesla V100S-PCIE-32GB') is a different card, not catalogued.",
    ),
    Card(
        "t4", "Tesla T4", (7, 5),
        memory_bytes=15642329088,
        memory_source=(
            "estimate: a published output (search index id 77589086) (setup notes): deviceQuery '\"Tesla T4\" ..."
            " 12.5 / 12.5 ... 7.5 ... 14918 MBytes (15642329088 bytes)' = 14.57 GiB (recent driver; GCP OOM in "
            "Zheng-Chong/CatVTON#133: 14.56 GiB). Colab/older drivers: 15843721216 B (11.2, id 32424744097) and"
            " OOM 'total capacity of 14.75 GiB' (yifanlu0227/MIT-6.5940#1, hpcaitech/Open-Sora#697)"
        ),
        context_bytes=141715046,
        context_source=(
            "estimate: Zheng-Chong/CatVTON#133 (GCP T4): 4.11 GiB in use, 3.72 GiB allocated + 264.21 MiB "
            "reserved-unallocated -> 0.13 GiB (a small process; libraries may not have been loaded yet)"
        ),
        bf16_tflops=None, fp16_tflops=65.0,
        flops_source=(
            "NVIDIA T4 datasheet (t4-tensor-core-datasheet-951643.pdf): Mixed Precision (FP16/FP32) 65 TFLOPS; "
            "no BF16 tensor support on Turing. Lightning 't4' and xformers 'T4' cite that datasheet"
        ),
        bandwidth_bytes_per_s=3.2e+11,
        bandwidth_source=(
            "NVIDIA T4 datasheet: 320+ GB/s GDDR6 (pcpartcomparison.com/gpu/tesla-t4-vs-l4: 320.0 GB/s; note "
            "xformers uses 300 GiB/s)"
        ),
        aliases=('tesla-t4', 't4-16gb', 'colab-t4'),
        notes=(
            "Total depends strongly on driver (14.57 vs 14.75 GiB). 70 W card - clocks throttle under sustained"
            " load."
        ),
    ),
)
BY_KEY: dict[str, Card] = {c.key: c for c in CARDS}
_ALIASES: dict[str, str] = {a: c.key for c in CARDS for a in (c.key, *c.aliases)}
# Short names that several cards answer to: refused with the list to choose from.
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "h100": ("h100-80gb", "h100-pcie", "h100-nvl"),
    "a100": ("a100-80gb", "a100-40gb", "a100-pcie-80gb", "a100-pcie-40gb"),
    "v100": ("v100-32gb", "v100-16gb", "v100-pcie-32gb"),
    "rtx-6000": ("rtx-6000-ada", "a6000"),
    "6000": ("rtx-6000-ada", "a6000"),
}
_SPELLING = re.compile(r"[\s_]+")


def normalised(text: str) -> str:
    """A card as typed ('NVIDIA RTX 4090', 'rtx_4090') in the table's spelling ('nvidia-rtx-4090' -> 'rtx-4090')."""
    key = _SPELLING.sub("-", text.strip().lower())
    return key.removeprefix("nvidia-").removeprefix("geforce-")


def find_card(text: str) -> Card | None:
    """The card a key, alias or torch name names; None when none does (or several do)."""
    key = normalised(text)
    found = _ALIASES.get(key) or _ALIASES.get(key.replace("rtx", "rtx-", 1) if key.startswith("rtx") and
                                                 not key.startswith("rtx-") else key)
    if found is not None:
        return BY_KEY[found]
    return card_named(text)


def card_named(name: str | None) -> Card | None:
    """The card torch names ``name`` ('NVIDIA H200'), if the table has it."""
    if not name:
        return None
    for card in CARDS:
        if name in (card.name, *card.names):
            return card
    return None


def suggest(text: str) -> list[str]:
    """The cards a mistyped or short key most likely means."""
    key = normalised(text)
    if key in AMBIGUOUS:
        return list(AMBIGUOUS[key])
    starts = [c.key for c in CARDS if c.key.startswith(key + "-") or c.key.split("-")[0] == key]
    return starts or difflib.get_close_matches(key, list(_ALIASES), n=2)


def card_or_size(text: str) -> Card | int:
    """A card of the table, or a raw memory size ('24GiB': bytes); ConfigError naming the choices otherwise."""
    card = find_card(text)
    if card is not None:
        return card
    if re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*[a-zA-Z]*\s*", text) and re.search(r"[0-9]", text):
        try:
            return parse_size(text, what="--gpu")
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or name a card: ckptbench gpus lists them)") from None
    hint = suggest(text)
    extra = f" (did you mean {' or '.join(map(repr, hint))}?)" if hint else ""
    raise ConfigError(f"--gpu: unknown card {text!r}{extra}; `ckptbench gpus` lists the {len(CARDS)} known cards, or "
                      "give a memory size such as 24GiB")
