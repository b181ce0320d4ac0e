"""A whole grid on this machine: ``localgrid`` starts a Master, relays and agents as separate processes (the demo, the
end-to-end tests and the benchmarks use it); ``demo`` is the grid behind ``idlegrid demo``."""
