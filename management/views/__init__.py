"""What the API answers, one module per resource area: each holds its answers' msgspec structs (the one definition
of an answer's shape, which the OpenAPI document states and the console reads too) beside the functions that build
them from the services' records. Services return records and plain dataclasses, never an answer; the API's handlers
(management/api/resources/) and the console's pages turn them into answers here.

| module | answers |
|---|---|
| ``base`` | ``View`` (every answer forbids unknown fields), ``Time``, ``Money``, ``page_of``, ``rfc3339``/``instant`` |
| ``errors`` | ``Error``: every refusal and failure |
| ``hosts`` | hosts (agents), GPUs, tiers, what a host runs |
| ``verification`` | a GPU's measured verification, a host's runs, a run started |
| ``grid`` | commands, enrollment tokens, events, command-signing keys |
| ``workloads`` | workloads, their spec and terms, why one waits, outputs, network, storage |
| ``accounts`` | accounts, API keys, whoami |
| ``prices`` | providers' and hosts' prices |
| ``market`` | offers, balances, the ledger, statements, rentals |
| ``tunnels`` | a tunnel's grant |
| ``telemetry`` | GPU, host and workload telemetry history |
| ``links`` | a workload's HTTPS links, a link token |
| ``templates`` | launch templates with the spec each launches |
| ``alerts`` | alert rules, alerts and their transitions, silences, webhooks |
| ``ssh`` | SSH public keys, a workload's host keys |
| ``secrets`` | secrets by name (never a value) |
| ``reports`` | a report in JSON (its CSV: management/monitoring/report_render.py) |

Every timestamp is an RFC 3339 UTC string with milliseconds ("2026-11-22T17:40:00.000Z"), or null for a moment that
has not happened (the records keep 0 or None for "never"); money is a decimal string in the grid's currency.
"""
