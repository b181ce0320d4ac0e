"""Launch templates (docs/templates.md): a catalog of ready workloads in TOML, shipped with the Master
(``catalog/*.toml``) and extended by the operator (``templates_dir``), turned into workload specs (``templates``)."""
