"""The real benchmark's rounds kernel without a GPU (none here, none in CI): its batches' sizing, and its source
compiled by NVRTC for every architecture of the catalog that has FP16 tensor cores of its shape (NVRTC needs no GPU;
skipped where the agent's gpu extra is not installed). What the kernel computes is checked on a card by its own
self-test against the CPU's answer (CudaBenchmark.self_test) before a host offers the rounds form; the protocol
around it is tested with the simulated benchmark (tests/master/test_challenge_sizing.py)."""

from __future__ import annotations

import pytest

from agent.benchmark.cuda import KERNELS, ROUND_BATCH_BYTES, round_batch
from agent.benchmark.interface import BenchmarkUnavailable
from common.catalog import CATALOG
from common.challenge import Shape
from master.verification import ChallengeSettings, sized_shape


def test_a_batch_of_rounds_holds_at_most_its_bytes_and_a_grids_depth() -> None:
    assert round_batch(Shape(512, 1024, 22_000_000)) == ROUND_BATCH_BYTES // (4 * 512 * 1024)
    assert round_batch(Shape(64, 64, 3)) == 3
    assert round_batch(Shape(64, 32, 1 << 24)) == min(65535, ROUND_BATCH_BYTES // (4 * 64 * 32))


@pytest.mark.parametrize("model", ["h100-sxm", "a10", "t4", "rtx-3080"])
def test_the_masters_default_shape_fits_the_kernels_tiles(model: str) -> None:
    shape = sized_shape(CATALOG[model], ChallengeSettings())
    assert round_batch(shape) >= 1


def test_a_shape_off_the_kernels_tiles_is_refused_not_miscomputed() -> None:
    with pytest.raises(BenchmarkUnavailable, match="multiple of 64"):
        round_batch(Shape(100, 512, 4))
    with pytest.raises(BenchmarkUnavailable, match="k of 32"):
        round_batch(Shape(512, 16, 4))


@pytest.mark.parametrize(
    "arch",
    sorted(
        {
            f"sm_{m.compute_capability.replace('.', '')}"
            for m in CATALOG.values()
            if m.compute_capability and m.compute_capability >= "7.5"
        }
    ),
)
def test_the_kernels_compile_for_each_tensor_core_architecture(arch: str) -> None:
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="the agent's gpu extra (cuda-bindings, NVRTC) is not installed")
    error, program = nvrtc.nvrtcCreateProgram(KERNELS.encode(), b"idlegrid_bench.cu", 0, [], [])
    assert int(error) == 0
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++14"]
    compiled = nvrtc.nvrtcCompileProgram(program, len(options), options)[0]
    size = nvrtc.nvrtcGetProgramLogSize(program)[1]
    log = bytearray(size)  # NVRTC writes into it: never a bytes object (b" " * 1 is the process's shared b" ")
    nvrtc.nvrtcGetProgramLog(program, log)
    assert int(compiled) == 0, log.decode(errors="replace")
    assert int(nvrtc.nvrtcGetCUBINSize(program)[0]) == 0


def test_nvrtcs_refusal_is_said_with_its_log_and_leaves_the_process_s_shared_bytes_alone() -> None:
    """The agent's own compile step (CudaBenchmark._compile) with real NVRTC and an architecture it refuses: the log
    comes back in the error, and NVRTC's writes went into a buffer of the agent's, not into a bytes object (an empty
    log, one NUL, once overwrote the interpreter's shared b" ": tests/support/singletons.py)."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="the agent's gpu extra (cuda-bindings, NVRTC) is not installed")
    from agent.benchmark.cuda import CudaBenchmark

    bench = CudaBenchmark.__new__(CudaBenchmark)  # no driver, no GPU: only NVRTC is used before the module load
    bench.nvrtc = nvrtc
    refused = "NVRTC could not compile the benchmark: nvrtc: error: invalid value for --gpu-architecture"
    with pytest.raises(BenchmarkUnavailable, match=refused):
        bench._compile(1, 0)
    assert b" "[0] == 0x20 and bytes(range(256))[32:33] == b"\x20"
