"""Why a workload waits, as text a renter reads: ``idlegrid workload explain`` and ``workload get`` print it.

Input is what the API answers (``GET /api/v1/workloads/{id}`` and ``.../explain``: plain JSON, times as RFC 3339).
The first line is the scheduler's sentence; then the queue, what blocks it, the quota, the times, and the table of
constraints (how many GPUs each one removed and how many were left), showing only the constraints that removed any.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

REJECTED = "Rejected: "  # how the scheduler core starts the sentence of a workload it can never place


def render_explanation(workload: dict[str, Any], explanation: dict[str, Any], now: datetime) -> str:
    """The explanation of ``workload``'s wait, at ``now`` (for the "in 5 min" next to each time)."""
    e = explanation
    summary = e["summary"] or "The scheduler gave no reason."
    if e["position"] == 0 and summary.startswith(REJECTED):
        summary = (
            f"It cannot run on this grid as the grid is now: {summary.removeprefix(REJECTED)} "
            "Change the request (or wait for such hosts to join)."
        )
    spec = workload["spec"]
    lines = [
        f"{workload['id']} ({workload['name']}) waits. {summary}",
        "",
        f"asks:             {_asks(spec)}",
        f"queue:            {_queue(e)}",
    ]
    if e["blocked_by"]:
        lines.append(f"blocked by:       {e['blocked_by']}")
    lines.append(f"quota:            {_quota(workload['account'], e['quota'])}")
    lines.append(f"fits idle GPUs:   {'yes' if e['fits_now'] else 'no'}")
    lines.append(f"reserved start:   {_moment(e['reserved_start'], now) if e['reserved_start'] else 'none'}")
    lines.append(f"estimated start:  {_estimate(e, now)}")
    lines.append("")
    lines.extend(_constraints(e["filters"]))
    return "\n".join(lines)


def _asks(spec: dict[str, Any]) -> str:
    replica = spec["replica"]
    what = f"{spec['replicas']} x {replica['gpus']} GPU" if spec["replicas"] > 1 else f"{replica['gpus']} GPU"
    gang = " (a gang: every replica starts at once, each on one host)" if spec["replicas"] > 1 else " on one host"
    models = f" of {', '.join(replica['models'])}" if replica["models"] else ""
    return f"{what}{models}{gang}, priority {spec['priority']}"


def _queue(e: dict[str, Any]) -> str:
    if e["position"] == 0:
        return f"not in line ({e['queue_length']} waiting)"
    ahead = f"; just ahead: {', '.join(e['ahead'])}" if e["ahead"] else "; nothing ahead of it"
    return f"position {e['position']} of {e['queue_length']} in the order the scheduler considers them{ahead}"


def _quota(account: str, quota: dict[str, Any] | None) -> str:
    if quota is None:
        return f"account {account} has no GPU quota"
    what = "GPUs" if quota["quota"] == "gpus" else f"GPUs of tier {quota['quota'].removeprefix('tier:')}"
    over = quota["in_use"] + quota["asked"] - quota["limit"]
    verdict = f"over by {over}" if over > 0 else "within it"
    held = f"account {account} holds {quota['in_use']} of its {quota['limit']} {what}"
    return f"{held}; this asks {quota['asked']} more ({verdict})"


def _estimate(e: dict[str, Any], now: datetime) -> str:
    quota = e["quota"]
    if quota is not None and quota["in_use"] + quota["asked"] > quota["limit"]:
        return "when the account's other workloads end and free enough of its quota"
    if e["estimated_start"] is None:
        return "unknown: no running workload that would make room has a known end"
    return _moment(e["estimated_start"], now)


def _moment(stamp: str, now: datetime) -> str:
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = (moment - now).total_seconds()
    if seconds < 60:
        relative = "now" if seconds < 1 else f"in {seconds:.0f} s"
    elif seconds < 90 * 60:
        relative = f"in {seconds / 60:.0f} min"
    else:
        relative = f"in {seconds / 3600:.1f} h"
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({relative})"


def _constraints(filters: list[dict[str, Any]]) -> list[str]:
    if not filters:
        return ["constraints:      not checked (the scheduler decided before looking at GPUs)"]
    total = filters[0]["removed"] + filters[0]["remaining"]
    removing = [f for f in filters if f["removed"]]
    rows = [("constraint", "removed", "remaining"), ("(GPUs on the grid)", "", str(total))]
    rows += [(f["name"], str(f["removed"]), str(f["remaining"])) for f in removing]
    width = max(len(r[0]) for r in rows)
    lines = [f"{name.ljust(width)}  {removed.rjust(7)}  {remaining.rjust(9)}" for name, removed, remaining in rows]
    others = len(filters) - len(removing)
    if others:
        lines.append(f"(the other {others} constraints removed none)")
    left = filters[-1]["remaining"]
    lines.append(f"{left} GPU(s) pass every constraint now" if left else "no GPU passes every constraint now")
    return lines
