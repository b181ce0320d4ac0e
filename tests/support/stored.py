"""Reading back what a test's grid stored, asserted present: a missing record fails with its id, not an AttributeError."""

from __future__ import annotations

from management.store import workload_repo
from master.records import WorkloadRecord
from master.store import Store


async def stored_workload(store: Store, workload_id: str) -> WorkloadRecord:
    """The workload ``workload_id`` as the store holds it now."""
    rec = await workload_repo(store).get(workload_id)
    assert rec is not None, f"workload {workload_id} is not in the store"
    return rec
