"""Clients of the management API: ``api`` (requests, paging and retries over two thin transports, one client for the
CLI, the demo, the tests and the bench) and ``tunnel`` (a renter's end of a tunnel to a workload's container)."""
