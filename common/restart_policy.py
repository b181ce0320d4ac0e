"""What a workload does when its containers end (``WorkloadSpec.restart_policy``, master/records.py): never again,
back to the queue when one fails, or also when all exit 0. In a module of its own, importing nothing, so the CLI
offers the choices without loading the Master (or anything heavy: docs/cli.md "Starting fast")."""

RESTART_POLICIES = ("never", "on_failure", "always")
