"""Why a workload waits, as text a renter reads: ``idlegrid workload explain`` and ``workload get`` print it.

Input is what the API answers (``GET /api/v1/workloads/{id}`` and ``.../explain``: plain JSON, times as RFC 3339).
The first line is the scheduler's sentence; then the queue, what blocks it, the quota, the times, and the table of
constraints (how many GPUs each one removed and how many were left), showing only the constraints that removed any.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from management.client.api import AnswerJson

REJECTED = "Rejected: "  # how the scheduler core starts the sentence of a workload it can never place
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)\.\d{3}Z")


def render_explanation(workload: AnswerJson, explanation: AnswerJson, now: datetime) -> str:
    """The explanation of ``workload``'s wait, at ``now`` (for the "in 5 min" next to each time)."""
    e = explanation
    summary = _readable(e["summary"] or "The scheduler gave no reason.")
    rejected = e["position"] == 0 and summary.startswith(REJECTED)
    cannot = rejected or bool(e.get("cannot_fit"))
    who = f"{workload['id']} ({workload['name']})"
    if rejected:
        first = f"{who} can never run as asked: {summary.removeprefix(REJECTED)} Change the request."
    else:
        first = f"{who} waits. {summary}"
    lines = [first, "", f"asks:             {_asks(workload['spec'])}", f"queue:            {_queue(e)}"]
    quota_over = _over(e["quota"])
    if quota_over:
        lines.append(f"blocked by:       the GPU quota of account {workload['account']}")
    elif e["blocked_by"]:
        lines.append(f"blocked by:       {_readable(e['blocked_by'])}")
    lines.append(f"quota:            {_quota(workload['account'], e['quota'])}")
    lines.append(f"fits idle GPUs:   {'yes' if e['fits_now'] else 'no'}")
    lines.append(f"reserved start:   {_moment(e['reserved_start'], now) if e['reserved_start'] else 'none'}")
    if rejected:
        lines.append("estimated start:  never: it is refused as asked")
    elif cannot:
        lines.append("estimated start:  when hosts that can hold it join (none on the grid as it is now)")
    elif quota_over:
        lines.append("estimated start:  when the account's other workloads end and free enough of its quota")
    elif e["estimated_start"] is None:
        lines.append("estimated start:  unknown: no running workload that would make room has a known end")
    else:
        lines.append(f"estimated start:  {_moment(e['estimated_start'], now)}")
    lines.append("")
    spec = workload["spec"]
    lines.extend(_constraints(e["filters"], spec["replicas"] * spec["replica"]["gpus"]))
    return "\n".join(lines)


def _readable(sentence: str) -> str:
    """RFC 3339 times in the scheduler's sentences as a person reads them: 2026-11-22 18:04:01 UTC."""
    return _RFC3339.sub(r"\1 \2 UTC", sentence)


def _over(quota: AnswerJson | None) -> bool:
    return quota is not None and quota["in_use"] + quota["asked"] > quota["limit"]


def _asks(spec: AnswerJson) -> str:
    gpus = spec["replica"]["gpus"]
    models = spec["replica"]["models"]
    what = f"{gpus} GPU{'s' if gpus > 1 else ''}" + (f" ({' or '.join(models)})" if models else "")
    if spec["replicas"] > 1:
        return f"{spec['replicas']} replicas of {what}, each on one host, all started at once; priority {spec['priority']}"
    return f"{what} on one host; priority {spec['priority']}"


def _queue(e: AnswerJson) -> str:
    if e["position"] == 0:
        return f"not in line ({e['queue_length']} waiting)"
    ahead = f"; just ahead: {', '.join(e['ahead'])}" if e["ahead"] else "; nothing ahead of it"
    return f"position {e['position']} of {e['queue_length']} in the order the scheduler considers them{ahead}"


def _quota(account: str, quota: AnswerJson | None) -> str:
    if quota is None:
        return f"account {account} has no GPU quota"
    what = "GPUs" if quota["quota"] == "gpus" else f"GPUs of tier {quota['quota'].removeprefix('tier:')}"
    over = quota["in_use"] + quota["asked"] - quota["limit"]
    verdict = f"{over} over it" if over > 0 else "within it"
    held = f"account {account} holds {quota['in_use']} of its {quota['limit']} {what}"
    return f"{held}; this asks {quota['asked']} more ({verdict})"


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


def _constraints(filters: list[AnswerJson], needed: int) -> list[str]:
    if not filters:
        return ["constraints:      not counted (the scheduler decided before it looked at single GPUs)"]
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
    passing = "no GPU passes" if left == 0 else ("1 GPU passes" if left == 1 else f"{left} GPUs pass")
    lines.append(f"{passing} every constraint now; it needs {needed} at once")
    return lines
