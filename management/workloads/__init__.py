"""The workload: its states, its spec's checks, the book that writes its record, the pure lifecycle step and the
runner that carries the step's actions out. See docs/workloads.md."""
