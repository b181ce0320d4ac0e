"""The real benchmark: NVIDIA's driver API (``cuda-bindings``) with kernels compiled at run time by NVRTC.

Nothing but the NVIDIA driver is needed on the host: ``libcuda`` comes with the driver, and ``cuda-bindings`` and the
NVRTC compiler come from pip (the ``gpu`` extra: ``pip install 'idlegrid[gpu]'``). Without them the agent still
runs, and answers challenges with a refusal naming what to install.

Per GPU, in a few seconds: tensor-core throughput (``mma.sync`` BF16 and FP16 on compute capability 8.0 and later,
FP16 on 7.x), FP32 FMA throughput, device copy bandwidth, pinned host-to-device and device-to-host bandwidth, how much
memory can be allocated and written, and the challenge (common/challenge.py) computed by an exact FP32 tiled kernel.

NOT RUN IN CI: no GPU there. Every line here runs only where a GPU is lent (scripts/gpu-smoke runs it and prints the
figures); the simulated benchmark (agent/benchmark/simulated.py) implements the same interface for CI.
"""

from __future__ import annotations

import ctypes
import struct
import time
from typing import Any

from agent.benchmark.interface import BenchmarkRun, BenchmarkUnavailable, ChallengeTask
from common.challenge import P, round_seed
from common.wire import BenchmarkFigures

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
"""
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

    def run(self, task: ChallengeTask) -> BenchmarkRun:
        driver = self.driver
        started = time.perf_counter()
        device = self._device(task.gpu_uuid)
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
            module = self._compile(major, minor)
            rows = self._challenge(module, task)
            figures = self._measure(module, major, sms)
        finally:
            driver.cuDevicePrimaryCtxRelease(device)
        figures.duration_s = round(time.perf_counter() - started, 3)
        return BenchmarkRun(figures=figures, rows=rows)

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
        if int(error) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            text = b" " * size
            nvrtc.nvrtcGetProgramLog(program, text)
            raise BenchmarkUnavailable(f"NVRTC could not compile the benchmark: {text.decode(errors='replace')[:2000]}")
        size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return _check(self.driver.cuModuleLoadData(cubin), "cuModuleLoadData")

    def _function(self, module: Any, name: str) -> Any:
        return _check(self.driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction {name}")

    def _launch(self, module: Any, name: str, grid: tuple[int, int], block: tuple[int, int], args: tuple, types: tuple) -> None:
        _check(
            self.driver.cuLaunchKernel(
                self._function(module, name), grid[0], grid[1], 1, block[0], block[1], 1, 0, 0, (args, types), 0
            ),
            f"launch {name}",
        )

    def _sync(self) -> None:
        _check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def _alloc(self, size: int) -> Any:
        return _check(self.driver.cuMemAlloc(size), f"cuMemAlloc of {size} bytes")

    # -- the challenge -------------------------------------------------------------------------------------------

    def _challenge(self, module: Any, task: ChallengeTask) -> list[list[int]]:
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
        values = struct.unpack(f"<{n * n}q", host)
        return [list(values[i * n : (i + 1) * n]) for i in range(n)]

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


def open_benchmark() -> tuple[CudaBenchmark | None, str]:
    """The real benchmark, or None and why it cannot run here (one line, with what to do)."""
    try:
        return CudaBenchmark(), ""
    except BenchmarkUnavailable as exc:
        return None, str(exc)
