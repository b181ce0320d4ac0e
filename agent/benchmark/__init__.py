"""The agent's GPU benchmark and its answer to the Master's verification challenge.

- ``interface``: what a benchmark is (``GpuBenchmark``), what it returns (``BenchmarkRun``).
- ``simulated``: simulated GPUs with the catalog's figures, and the cheats CI tests (a slower card, a replayed answer,
  a late answer).
- ``cuda``: the real path, NVIDIA's driver API through ``cuda-bindings`` with kernels compiled by NVRTC at run time
  (the optional ``gpu`` extra); it needs only the NVIDIA driver on the host.
- ``responder``: the agent's side of the challenge protocol (challenge -> commit, reveal -> open), sans I/O.

Design and what the challenge proves: docs/verification.md.
"""
