"""The ``idlegrid`` command line: ``main`` composes the commands; one module per command group (accounts, access,
alerts, hosts, market, reports, workloads) talks to the management API through ``management.client``; ``connection``
holds the options and output helpers they share."""
