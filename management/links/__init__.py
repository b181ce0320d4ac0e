"""HTTPS links to workloads' http ports (docs/links.md): names and tokens (``names``), who may pass (``gate``), the
tunnels they ride (``tunnels``) and the HTTP and WebSocket proxy (``proxy``). The links service
(management/services/links.py) holds them together."""
