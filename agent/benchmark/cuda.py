"""The real benchmark: NVIDIA's driver API (``cuda-bindings``) with kernels compiled at run time by NVRTC.

Nothing but the NVIDIA driver is needed on the host: ``libcuda`` comes with the driver, and ``cuda-bindings`` and the
NVRTC compiler come from pip (the ``gpu`` extra: ``pip install 'idlegrid[gpu]'``). Without them the agent still
runs, and answers challenges with a refusal naming what to install.

Per GPU, in a few seconds: tensor-core throughput (``mma.sync`` BF16 and FP16 on compute capability 8.0 and later,
FP16 on 7.x), FP32 FMA throughput, device copy bandwidth, pinned host-to-device and device-to-host bandwidth, how much
memory can be allocated and written, and the challenge (common/challenge.py): the sum form by an exact FP32 tiled
kernel, the rounds form on tensor cores (``rounds_mma``: INT8 ``mma.sync`` m16n8k32 with INT32 accumulators from
compute capability 8.0, FP16 m16n8k8 with FP32 accumulators on 7.5; both exact for its 8-bit entries), each round's
product folded into its digest in the kernel's epilogue. The rounds form is offered (``forms``) only after its
self-test gave the CPU's digests on every card of the host.

NOT RUN IN CI: no GPU there. Every line here runs only where a GPU is lent (scripts/gpu-smoke runs it and prints the
figures); the simulated benchmark (agent/benchmark/simulated.py) implements the same interface for CI, and
tests/agent/test_cuda_kernels.py compiles the kernels with NVRTC where the gpu extra is installed. The rounds kernel
was written without a GPU lent: it has been compiled for sm_75 to sm_90, never run.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from agent.benchmark.interface import BenchmarkRun, BenchmarkUnavailable, ChallengeTask
from common.challenge import FORM_ROUNDS, AnswerRows, P, Shape, digest_rows, digests, round_seed, weight_seed
from common.wire import BenchmarkFigures

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTALL_HINT = "install the agent's gpu extra (pip install 'idlegrid[gpu]': cuda-bindings and NVRTC)"
COPY_BYTES = 1 << 30  # device copy: 1 GiB read + 1 GiB written per pass
HOST_COPY_BYTES = 256 << 20  # pinned host buffer for H2D / D2H
ALLOC_CHUNK_BYTES = 1 << 30
PASSES = 5  # timed repetitions of each probe; the best counts (the first warms clocks and caches)

KERNELS = r"""
typedef unsigned long long u64;
typedef long long i64;
__device__ __forceinline__ u64 mix(u64 x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
// An input matrix of the challenge: entries -1, 0, 1 from the seed (common/challenge.py entry()).
extern "C" __global__ void fill(float* out, u64 count, u64 seed) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        out[i] = (float)((i64)(mix(seed ^ i) % 3ULL) - 1);
}
// acc[i, j] = (acc[i, j] + sum_t a[i, t] b[t, j]) mod P: exact, since |sum| <= k < 2^24.
#define TILE 16
extern "C" __global__ void gemm_acc(const float* a, const float* b, i64* acc, int n, int k, i64 p) {
    __shared__ float sa[TILE][TILE];
    __shared__ float sb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;
    for (int t0 = 0; t0 < k; t0 += TILE) {
        sa[threadIdx.y][threadIdx.x] = (row < n && t0 + threadIdx.x < k) ? a[(u64)row * k + t0 + threadIdx.x] : 0.0f;
        sb[threadIdx.y][threadIdx.x] = (col < n && t0 + threadIdx.y < k) ? b[(u64)(t0 + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int t = 0; t < TILE; ++t) sum += sa[threadIdx.y][t] * sb[t][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) {
        i64 v = (acc[(u64)row * n + col] + (i64)sum) % p;
        acc[(u64)row * n + col] = v < 0 ? v + p : v;
    }
}
extern "C" __global__ void copy(const float4* in, float4* out, u64 count) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        out[i] = in[i];
}
// FP32 FMA throughput: 8 independent chains per thread, so the pipelines stay full.
extern "C" __global__ void fma32(float* out, int iterations) {
    float x[8];
    for (int c = 0; c < 8; ++c) x[c] = threadIdx.x + c;
    for (int i = 0; i < iterations; ++i)
        for (int c = 0; c < 8; ++c) x[c] = fmaf(x[c], 0.999f, 0.001f);
    float s = 0.0f;
    for (int c = 0; c < 8; ++c) s += x[c];
    if (s == 12345.0f) out[0] = s;  // never true; keeps the loop from being optimised away
}
#if __CUDA_ARCH__ >= 800
#define MMA_BF16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define MMA_K 16
#else
#define MMA_BF16 MMA_F16
#define MMA_F16 "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
#define MMA_K 8
#endif
// Tensor-core throughput: each warp issues mma on registers, 4 independent accumulators.
template <int BF16> __device__ void mma_loop(float* out, int iterations) {
    unsigned a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 ^ 5, b1 = a0 ^ 9;
    float d[4][4] = {};
    for (int i = 0; i < iterations; ++i) {
        for (int c = 0; c < 4; ++c) {
#if __CUDA_ARCH__ >= 800
            if (BF16)
                asm volatile(MMA_BF16 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                    : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            else
                asm volatile(MMA_F16 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                    : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
            asm volatile(MMA_F16 " {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                : "r"(a0), "r"(a1), "r"(b0));
#endif
        }
    }
    float s = 0.0f;
    for (int c = 0; c < 4; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    if (s == 12345.0f) out[0] = s;
}
extern "C" __global__ void mma_bf16(float* out, int iterations) { mma_loop<1>(out, iterations); }
extern "C" __global__ void mma_f16(float* out, int iterations) { mma_loop<0>(out, iterations); }

// -- the challenge's rounds form (common/challenge.py) ----------------------------------------------------------------
// Round r's A (n x k, row by row) and B (column by column, so that mma's "col" operand is contiguous): signed bytes, the
// eight bytes of one mix() at a time. INT8 on compute capability 8.0 and later (mma m16n8k32, INT32 accumulators): the
// words are stored as they are. FP16 on 7.5 (mma m16n8k8, FP32 accumulators, exact: every partial sum is an integer
// within 2^24): each byte becomes a half.
#if __CUDA_ARCH__ >= 800
typedef signed char round_t;
#define ROUND_K 32
#else
typedef unsigned short round_t;
#define ROUND_K 8
__constant__ unsigned short HALF_OF[256] = {  // IEEE half bits of -128 .. 127
    0xD800, 0xD7F0, 0xD7E0, 0xD7D0, 0xD7C0, 0xD7B0, 0xD7A0, 0xD790, 0xD780, 0xD770, 0xD760, 0xD750,
    0xD740, 0xD730, 0xD720, 0xD710, 0xD700, 0xD6F0, 0xD6E0, 0xD6D0, 0xD6C0, 0xD6B0, 0xD6A0, 0xD690,
    0xD680, 0xD670, 0xD660, 0xD650, 0xD640, 0xD630, 0xD620, 0xD610, 0xD600, 0xD5F0, 0xD5E0, 0xD5D0,
    0xD5C0, 0xD5B0, 0xD5A0, 0xD590, 0xD580, 0xD570, 0xD560, 0xD550, 0xD540, 0xD530, 0xD520, 0xD510,
    0xD500, 0xD4F0, 0xD4E0, 0xD4D0, 0xD4C0, 0xD4B0, 0xD4A0, 0xD490, 0xD480, 0xD470, 0xD460, 0xD450,
    0xD440, 0xD430, 0xD420, 0xD410, 0xD400, 0xD3E0, 0xD3C0, 0xD3A0, 0xD380, 0xD360, 0xD340, 0xD320,
    0xD300, 0xD2E0, 0xD2C0, 0xD2A0, 0xD280, 0xD260, 0xD240, 0xD220, 0xD200, 0xD1E0, 0xD1C0, 0xD1A0,
    0xD180, 0xD160, 0xD140, 0xD120, 0xD100, 0xD0E0, 0xD0C0, 0xD0A0, 0xD080, 0xD060, 0xD040, 0xD020,
    0xD000, 0xCFC0, 0xCF80, 0xCF40, 0xCF00, 0xCEC0, 0xCE80, 0xCE40, 0xCE00, 0xCDC0, 0xCD80, 0xCD40,
    0xCD00, 0xCCC0, 0xCC80, 0xCC40, 0xCC00, 0xCB80, 0xCB00, 0xCA80, 0xCA00, 0xC980, 0xC900, 0xC880,
    0xC800, 0xC700, 0xC600, 0xC500, 0xC400, 0xC200, 0xC000, 0xBC00, 0x0000, 0x3C00, 0x4000, 0x4200,
    0x4400, 0x4500, 0x4600, 0x4700, 0x4800, 0x4880, 0x4900, 0x4980, 0x4A00, 0x4A80, 0x4B00, 0x4B80,
    0x4C00, 0x4C40, 0x4C80, 0x4CC0, 0x4D00, 0x4D40, 0x4D80, 0x4DC0, 0x4E00, 0x4E40, 0x4E80, 0x4EC0,
    0x4F00, 0x4F40, 0x4F80, 0x4FC0, 0x5000, 0x5020, 0x5040, 0x5060, 0x5080, 0x50A0, 0x50C0, 0x50E0,
    0x5100, 0x5120, 0x5140, 0x5160, 0x5180, 0x51A0, 0x51C0, 0x51E0, 0x5200, 0x5220, 0x5240, 0x5260,
    0x5280, 0x52A0, 0x52C0, 0x52E0, 0x5300, 0x5320, 0x5340, 0x5360, 0x5380, 0x53A0, 0x53C0, 0x53E0,
    0x5400, 0x5410, 0x5420, 0x5430, 0x5440, 0x5450, 0x5460, 0x5470, 0x5480, 0x5490, 0x54A0, 0x54B0,
    0x54C0, 0x54D0, 0x54E0, 0x54F0, 0x5500, 0x5510, 0x5520, 0x5530, 0x5540, 0x5550, 0x5560, 0x5570,
    0x5580, 0x5590, 0x55A0, 0x55B0, 0x55C0, 0x55D0, 0x55E0, 0x55F0, 0x5600, 0x5610, 0x5620, 0x5630,
    0x5640, 0x5650, 0x5660, 0x5670, 0x5680, 0x5690, 0x56A0, 0x56B0, 0x56C0, 0x56D0, 0x56E0, 0x56F0,
    0x5700, 0x5710, 0x5720, 0x5730, 0x5740, 0x5750, 0x5760, 0x5770, 0x5780, 0x5790, 0x57A0, 0x57B0,
    0x57C0, 0x57D0, 0x57E0, 0x57F0,
};
#endif
__device__ __forceinline__ u64 round_seed(u64 seed, u64 r, u64 which) { return mix(seed ^ mix((r << 1) | which)); }
__device__ __forceinline__ void put_word(round_t* out, u64 x8, u64 word) {
#if __CUDA_ARCH__ >= 800
    ((u64*)out)[x8] = word;  // little-endian: byte b is entry 8 * x8 + b
#else
    for (int b = 0; b < 8; ++b) out[8 * x8 + b] = HALF_OF[(int)(signed char)(word >> (8 * b)) + 128];
#endif
}
extern "C" __global__ void fill_rounds(round_t* a, round_t* bt, u64 seed, u64 first, int n, int k) {
    u64 r = first + blockIdx.y, per = (u64)n * k, words = per / 8;
    u64 sa = round_seed(seed, r, 0), sb = round_seed(seed, r, 1);
    round_t* ar = a + blockIdx.y * per;
    round_t* br = bt + blockIdx.y * per;
    for (u64 x8 = blockIdx.x * (u64)blockDim.x + threadIdx.x; x8 < words; x8 += (u64)gridDim.x * blockDim.x) {
        put_word(ar, x8, mix(sa ^ x8));  // A[i, t] at i * k + t
        put_word(br, x8, mix(sb ^ x8));  // B[t, j] at j * k + t
    }
}
// The digests' weights W[i, j] (n x n), the same for every round.
extern "C" __global__ void fill_weights(u64* w, u64 seed, u64 count) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        w[i] = mix(seed ^ i);
}
// One block of 4 warps: a 64 x 64 tile of round (first + blockIdx.z)'s product, each warp 32 x 32 (2 x 4 mma tiles of
// 16 x 8), fragments read straight from L2/L1 as 32-bit words (4 INT8 or 2 FP16 entries each; PTX ISA "Matrix
// Fragments for mma.m16n8k32" and "mma.m16n8k8"); then sum W[i, j] * C[i, j] over the tile (mod 2^64, the product as
// two's complement) into the round's digest. n % 64 == 0, k % 32 == 0.
extern "C" __global__ void rounds_mma(const round_t* a, const round_t* bt, const u64* w, u64* digests, u64 first, int n,
                                      int k) {
#if __CUDA_ARCH__ >= 750
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int row0 = blockIdx.y * 64 + (warp >> 1) * 32, col0 = blockIdx.x * 64 + (warp & 1) * 32;
    u64 per = (u64)n * k, words = (u64)k * sizeof(round_t) / 4;
    const unsigned* ar = (const unsigned*)(a + blockIdx.z * per);
    const unsigned* br = (const unsigned*)(bt + blockIdx.z * per);
#if ROUND_K == 32
    int acc[2][4][4] = {};
#else
    float acc[2][4][4] = {};
#endif
    for (int t0 = 0; t0 < k; t0 += ROUND_K) {
        u64 word = (u64)t0 * sizeof(round_t) / 4 + q;  // the word holding this lane's first entries of the k step
        unsigned fa[2][4], fb[4][2];
        for (int m = 0; m < 2; ++m) {
            u64 r = row0 + m * 16 + g;
            fa[m][0] = __ldg(ar + r * words + word);  // A[r, ...]
            fa[m][1] = __ldg(ar + (r + 8) * words + word);  // A[r + 8, ...]
#if ROUND_K == 32
            fa[m][2] = __ldg(ar + r * words + word + 4);  // A[r, 16 entries further]
            fa[m][3] = __ldg(ar + (r + 8) * words + word + 4);
#endif
        }
        for (int nb = 0; nb < 4; ++nb) {
            u64 c = col0 + nb * 8 + g;
            fb[nb][0] = __ldg(br + c * words + word);  // B[..., c]
#if ROUND_K == 32
            fb[nb][1] = __ldg(br + c * words + word + 4);  // B[16 entries further, c]
#endif
        }
        for (int m = 0; m < 2; ++m)
            for (int nb = 0; nb < 4; ++nb) {
#if ROUND_K == 32
                asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                    : "+r"(acc[m][nb][0]), "+r"(acc[m][nb][1]), "+r"(acc[m][nb][2]), "+r"(acc[m][nb][3])
                    : "r"(fa[m][0]), "r"(fa[m][1]), "r"(fa[m][2]), "r"(fa[m][3]), "r"(fb[nb][0]), "r"(fb[nb][1]));
#else
                asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                             "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                    : "+f"(acc[m][nb][0]), "+f"(acc[m][nb][1]), "+f"(acc[m][nb][2]), "+f"(acc[m][nb][3])
                    : "r"(fa[m][0]), "r"(fa[m][1]), "r"(fb[nb][0]));
#endif
            }
    }
    u64 sum = 0;
    for (int m = 0; m < 2; ++m)
        for (int nb = 0; nb < 4; ++nb)
            for (int e = 0; e < 4; ++e) {
                u64 i = row0 + m * 16 + g + (e >> 1) * 8, j = col0 + nb * 8 + 2 * q + (e & 1);
                sum += w[i * n + j] * (u64)(i64)acc[m][nb][e];
            }
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd((unsigned long long*)(digests + first + blockIdx.z), (unsigned long long)sum);
#endif
}
"""
ROUND_TILE = 64  # the rounds kernel's block tile (n must be a multiple of it)
ROUND_K_STEP = 32  # its k step on INT8 (k must be a multiple of it)
ROUND_BATCH_BYTES = 256 << 20  # the rounds' generated inputs held at once (A and B of each round, 2 bytes an entry)
SELF_TEST_SHAPE = Shape(64, 1024, 3)  # checked against the CPU's answer before the form is offered, at the largest k
MMA_FLOPS_PER_WARP = {8: 2 * 16 * 8 * 16, 7: 2 * 16 * 8 * 8}  # by compute capability major (>= 8 vs 7.x)


def _modules() -> tuple[Any, Any]:
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        raise BenchmarkUnavailable(f"the GPU benchmark needs NVIDIA's cuda-bindings: {INSTALL_HINT}") from None
    return driver, nvrtc


def _check(result: Any, what: str) -> Any:
    """cuda-bindings returns (error, *values): raise on an error, return the value(s)."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise BenchmarkUnavailable(f"{what} failed: {error!r}")
    return values[0] if len(values) == 1 else tuple(values)


class CudaBenchmark:
    simulated = False

    def __init__(self) -> None:
        self.driver, self.nvrtc = _modules()
        _check(self.driver.cuInit(0), "cuInit (is the NVIDIA driver loaded?)")
        self.forms: tuple[str, ...] = ()  # the rounds form once self_test passed on every card here

    def run(self, task: ChallengeTask) -> BenchmarkRun:
        started = time.perf_counter()

        def work(module: Any, major: int, minor: int, sms: int) -> tuple[AnswerRows, BenchmarkFigures]:
            rows = self._rounds(module, task) if task.form == FORM_ROUNDS else self._challenge(module, task)
            return rows, self._measure(module, major, sms)

        rows, figures = self._on_device(self._device(task.gpu_uuid), work)
        figures.duration_s = round(time.perf_counter() - started, 3)
        return BenchmarkRun(figures=figures, rows=rows)

    def self_test(self) -> str:
        """Offer the rounds form (``forms``) only if its tensor-core kernel gives the CPU's exact answer to a small
        challenge on every card of this host; otherwise say why (the host still answers the sum form)."""
        driver, problems = self.driver, []
        task = ChallengeTask("self-test", "", 0x1D1E6121D, SELF_TEST_SHAPE, 0.0, form=FORM_ROUNDS)
        expected = digests(task.seed, task.shape)

        def check(module: Any, major: int, minor: int, sms: int) -> str:
            if (major, minor) < (7, 5):
                return f"compute capability {major}.{minor} has no mma.sync of the rounds kernel's shapes"
            got = np.concatenate(list(self._rounds(module, task)))
            return "" if np.array_equal(got, expected) else "the rounds kernel's digests differ from the CPU's"

        for ordinal in range(_check(driver.cuDeviceGetCount(), "cuDeviceGetCount")):
            try:
                why = self._on_device(_check(driver.cuDeviceGet(ordinal), "cuDeviceGet"), check)
            except BenchmarkUnavailable as exc:
                why = str(exc)
            if why:
                problems.append(f"GPU {ordinal}: {why}")
        self.forms = () if problems else (FORM_ROUNDS,)
        return "; ".join(problems)

    def _on_device(self, device: Any, work: Callable[[Any, int, int, int], T]) -> T:
        """``work(module, major, minor, SMs)`` in the device's primary context, with the kernels compiled for it."""
        driver = self.driver
        context = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        try:
            _check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
            major = _check(
                driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
                "compute capability",
            )
            minor = _check(
                driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
                "compute capability",
            )
            sms = _check(
                driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "SMs"
            )
            return work(self._compile(major, minor), major, minor, sms)
        finally:
            driver.cuDevicePrimaryCtxRelease(device)

    # -- set-up --------------------------------------------------------------------------------------------------

    def _device(self, gpu_uuid: str) -> Any:
        driver = self.driver
        for ordinal in range(_check(driver.cuDeviceGetCount(), "cuDeviceGetCount")):
            device = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
            raw = bytes(_check(driver.cuDeviceGetUuid(device), "cuDeviceGetUuid").bytes)
            text = raw.hex()
            if gpu_uuid.lower().removeprefix("gpu-").replace("-", "") == text:
                return device
        raise BenchmarkUnavailable(f"no CUDA device has the uuid {gpu_uuid} (is CUDA_VISIBLE_DEVICES hiding it?)")

    def _compile(self, major: int, minor: int) -> Any:
        nvrtc = self.nvrtc
        program = _check(nvrtc.nvrtcCreateProgram(KERNELS.encode(), b"idlegrid_bench.cu", 0, [], []), "nvrtcCreateProgram")
        # Machine code for this card (sm_XY), not PTX: the driver loads it without JIT, so an older driver than the
        # NVRTC wheel's CUDA version still runs it.
        options = [f"--gpu-architecture=sm_{major}{minor}".encode(), b"-std=c++14"]
        error = nvrtc.nvrtcCompileProgram(program, len(options), options)[0]
        # NVRTC writes its log and the machine code into the buffer it is given: a bytearray, never a bytes object
        # (immutable, and ``b" " * 1`` is the interpreter's one shared b" ": an empty log, one NUL, turned every b" "
        # of the process into b"\x00").
        if int(error) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(program, log)
            said = log.rstrip(b"\0").decode(errors="replace")[:2000]
            raise BenchmarkUnavailable(f"NVRTC could not compile the benchmark: {said}")
        size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return _check(self.driver.cuModuleLoadData(bytes(cubin)), "cuModuleLoadData")

    def _function(self, module: Any, name: str) -> Any:
        return _check(self.driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction {name}")

    def _launch(self, module: Any, name: str, grid: tuple[int, ...], block: tuple[int, int], args: tuple, types: tuple) -> None:
        x, y, z = (*grid, 1, 1)[:3]
        _check(
            self.driver.cuLaunchKernel(self._function(module, name), x, y, z, block[0], block[1], 1, 0, 0, (args, types), 0),
            f"launch {name}",
        )

    def _sync(self) -> None:
        _check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def _alloc(self, size: int) -> Any:
        return _check(self.driver.cuMemAlloc(size), f"cuMemAlloc of {size} bytes")

    # -- the challenge -------------------------------------------------------------------------------------------

    def _challenge(self, module: Any, task: ChallengeTask) -> AnswerRows:
        n, k = task.shape.n, task.shape.k
        a, b, acc = self._alloc(4 * n * k), self._alloc(4 * k * n), self._alloc(8 * n * n)
        try:
            _check(self.driver.cuMemsetD8(acc, 0, 8 * n * n), "cuMemsetD8")
            tiles = ((n + 15) // 16, (n + 15) // 16)
            for r in range(task.shape.rounds):
                for buffer, which in ((a, 0), (b, 1)):
                    seed = round_seed(task.seed, r, which)
                    self._launch(
                        module, "fill", (1024, 1), (256, 1), (buffer, n * k, seed), (None, ctypes.c_uint64, ctypes.c_uint64)
                    )
                self._launch(
                    module,
                    "gemm_acc",
                    tiles,
                    (16, 16),
                    (a, b, acc, n, k, P),
                    (None, None, None, ctypes.c_int, ctypes.c_int, ctypes.c_int64),
                )
            self._sync()
            host = bytearray(8 * n * n)
            _check(self.driver.cuMemcpyDtoH(host, acc, len(host)), "cuMemcpyDtoH")
        finally:
            for buffer in (a, b, acc):
                self.driver.cuMemFree(buffer)
        return list(np.frombuffer(host, dtype="<u8").reshape(n, n))  # every value in [0, P): the kernel reduced it

    def _rounds(self, module: Any, task: ChallengeTask) -> AnswerRows:
        """The rounds form: every round's digest, a batch of rounds' inputs generated at a time, the digests kept on the
        card until the end (8 bytes a round)."""
        n, k, rounds = task.shape.n, task.shape.k, task.shape.rounds
        batch = round_batch(task.shape)
        matrix_bytes = 2 * n * k  # one FP16 matrix
        a, bt = self._alloc(matrix_bytes * batch), self._alloc(matrix_bytes * batch)
        w, out = self._alloc(8 * n * n), self._alloc(8 * rounds)
        u64, i32 = ctypes.c_uint64, ctypes.c_int
        try:
            _check(self.driver.cuMemsetD8(out, 0, 8 * rounds), "cuMemsetD8")
            self._launch(module, "fill_weights", (1024,), (256, 1), (w, weight_seed(task.seed), n * n), (None, u64, u64))
            for first in range(0, rounds, batch):
                count = min(batch, rounds - first)
                self._launch(
                    module,
                    "fill_rounds",
                    (64, count),
                    (256, 1),
                    (a, bt, task.seed, first, n, k),
                    (None, None, u64, u64, i32, i32),
                )
                self._launch(
                    module,
                    "rounds_mma",
                    (n // ROUND_TILE, n // ROUND_TILE, count),
                    (128, 1),
                    (a, bt, w, out, first, n, k),
                    (None, None, None, None, u64, i32, i32),
                )
            self._sync()
            host = bytearray(8 * rounds)
            _check(self.driver.cuMemcpyDtoH(host, out, len(host)), "cuMemcpyDtoH")
        finally:
            for buffer in (a, bt, w, out):
                self.driver.cuMemFree(buffer)
        return digest_rows(np.frombuffer(host, dtype="<u8"), task.shape)

    # -- the figures ---------------------------------------------------------------------------------------------

    def _timed(self, launch: Any) -> float:
        """The best of PASSES runs of ``launch``, in seconds."""
        best = float("inf")
        for _ in range(PASSES):
            self._sync()
            start = time.perf_counter()
            launch()
            self._sync()
            best = min(best, time.perf_counter() - start)
        return best

    def _measure(self, module: Any, major: int, sms: int) -> BenchmarkFigures:
        figures = BenchmarkFigures()
        scratch = self._alloc(16)
        try:
            iterations, blocks, threads = 4096, sms * 8, 256
            seconds = self._timed(
                lambda: self._launch(module, "fma32", (blocks, 1), (threads, 1), (scratch, iterations), (None, ctypes.c_int))
            )
            figures.fp32_tflops = round(2.0 * 8 * iterations * blocks * threads / seconds / 1e12, 1)
            warps = blocks * threads // 32
            per_warp = MMA_FLOPS_PER_WARP[8 if major >= 8 else 7] * 4 * iterations
            for name, field in (("mma_f16", "fp16_tflops"), ("mma_bf16", "bf16_tflops")):
                if field == "bf16_tflops" and major < 8:
                    continue  # no BF16 tensor cores before Ampere
                seconds = self._timed(
                    lambda name=name: self._launch(
                        module, name, (blocks, 1), (threads, 1), (scratch, iterations), (None, ctypes.c_int)
                    )
                )
                setattr(figures, field, round(per_warp * warps / seconds / 1e12, 1))
        finally:
            self.driver.cuMemFree(scratch)
        figures.memory_bandwidth_gbs = self._device_copy(module)
        figures.h2d_gbs, figures.d2h_gbs = self._host_copies()
        figures.allocatable_mib = self._allocatable_mib()
        return figures

    def _device_copy(self, module: Any) -> float:
        source, target = self._alloc(COPY_BYTES), self._alloc(COPY_BYTES)
        try:
            count = COPY_BYTES // 16
            seconds = self._timed(
                lambda: self._launch(module, "copy", (4096, 1), (256, 1), (source, target, count), (None, None, ctypes.c_uint64))
            )
        finally:
            self.driver.cuMemFree(source)
            self.driver.cuMemFree(target)
        return round(2 * COPY_BYTES / seconds / 1e9, 1)

    def _host_copies(self) -> tuple[float, float]:
        driver = self.driver
        host = _check(driver.cuMemAllocHost(HOST_COPY_BYTES), "cuMemAllocHost")
        device = self._alloc(HOST_COPY_BYTES)
        try:
            up = self._timed(lambda: _check(driver.cuMemcpyHtoD(device, host, HOST_COPY_BYTES), "cuMemcpyHtoD"))
            down = self._timed(lambda: _check(driver.cuMemcpyDtoH(host, device, HOST_COPY_BYTES), "cuMemcpyDtoH"))
        finally:
            driver.cuMemFree(device)
            driver.cuMemFreeHost(host)
        return round(HOST_COPY_BYTES / up / 1e9, 1), round(HOST_COPY_BYTES / down / 1e9, 1)

    def _allocatable_mib(self) -> int:
        """Allocate and write 1 GiB chunks until the card refuses, then give them all back."""
        driver, chunks = self.driver, []
        try:
            while True:
                error, pointer = driver.cuMemAlloc(ALLOC_CHUNK_BYTES)
                if int(error) != 0:
                    break
                chunks.append(pointer)
                _check(driver.cuMemsetD8(pointer, 0xA5, ALLOC_CHUNK_BYTES), "cuMemsetD8")
            self._sync()
        finally:
            for pointer in chunks:
                driver.cuMemFree(pointer)
        return len(chunks) * (ALLOC_CHUNK_BYTES >> 20)


def round_batch(shape: Shape) -> int:
    """Rounds whose inputs the rounds kernel generates at once: ROUND_BATCH_BYTES of A and B at most, and no more
    than a launch's grid holds (its z dimension). BenchmarkUnavailable for a shape the kernel's tiles do not cover."""
    if shape.n % ROUND_TILE or shape.k % ROUND_K_STEP:
        raise BenchmarkUnavailable(
            f"the rounds kernel needs n a multiple of {ROUND_TILE} and k of {ROUND_K_STEP}, got {shape.n} x {shape.k}"
        )
    per_round = 2 * (2 * shape.n * shape.k)
    return max(1, min(shape.rounds, 65535, ROUND_BATCH_BYTES // per_round))


def open_benchmark() -> tuple[CudaBenchmark | None, str]:
    """The real benchmark, or None and why it cannot run here (one line, with what to do). The rounds form is offered
    only where the self-test passed (a second or so at start: NVRTC and a small challenge on each card)."""
    try:
        benchmark = CudaBenchmark()
    except BenchmarkUnavailable as exc:
        return None, str(exc)
    try:
        why = benchmark.self_test()
    except Exception as exc:  # the self-test's code has not run on a card yet: whatever it raises, the agent starts
        log.exception("the rounds form's self-test failed")
        why = f"the self-test raised {exc!r}"
    if why:
        log.warning("the rounds challenge form is not offered: this host answers only the sum form", extra={"why": why})
    return benchmark, ""
