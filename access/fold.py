"""Folding, sans I/O: a relay's agents' heartbeats and telemetry of one interval, as one ``report_fold`` for the Master.

Each agent frame the relay would send the Master on its own costs the Master its framing, decoding and dispatch; a
fold costs it one frame per relay per interval and a few steps per agent (docs/access.md, "Folding"). What goes in:

- liveness as a set: an agent whose heartbeat says what its last one sent to the Master said (running containers,
  exits, overlay paths, ping echo; its sequence number and date aside), with no other frame of it before in the
  interval, is only named in ``alive`` (two such in one interval are one);
- changes as deltas: a heartbeat that says something new goes in full, and becomes what later ones are held to;
- telemetry as batches of samples: every telemetry frame, none coalesced;
- each agent's frames in the order it sent them (its ``alive`` mark first, then its frames).

Invariants: a fold holds at most ``max_samples`` samples and about ``max_bytes`` bytes (``add`` says when it is full:
the relay sends it at once); what the Master is believed to have (``told``) is only ever a heartbeat put in a fold
taken since the last ``reset``, so a fold lost on the way (the link dropped, the buffer shed it) is followed by a
``reset`` and every agent's next heartbeat goes in full; an agent that leaves takes its part of the waiting fold with
it. ``unfold`` turns what waits back into the agents' own frames, for a link that does not take folds.
"""

from __future__ import annotations

import msgspec

from common.wire import AgentReports, Heartbeat, ReportFold, Telemetry

ALIVE_BYTES = 48  # what naming an agent in ``alive`` costs a fold, roughly (its id, quotes and a comma)


def _content(beat: Heartbeat) -> Heartbeat:
    """What a heartbeat says beyond its sequence number and date: what the Master's handling of it reads."""
    return msgspec.structs.replace(beat, seq=0, ts=0.0)


class ReportFolder:
    """The fold being gathered, and each agent's heartbeat the Master is believed to have."""

    def __init__(self, max_samples: int, max_bytes: int) -> None:
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self._alive: dict[str, Heartbeat] = {}  # agent id -> its newest heartbeat, one the Master has in substance
        self._reports: dict[str, AgentReports] = {}
        self._told: dict[str, Heartbeat] = {}  # agent id -> the content of its last heartbeat put in a fold
        self.samples = 0  # samples folded (a heartbeat counts as one)
        self.size = 0  # bytes of the frames folded, roughly the encoded fold's size

    def __len__(self) -> int:
        """Agents named in the waiting fold."""
        return len(self._alive) + len(self._reports)

    @property
    def full(self) -> bool:
        return self.samples >= self.max_samples or self.size >= self.max_bytes

    def add(self, agent_id: str, frame: Heartbeat | Telemetry, size: int) -> bool:
        """Fold ``frame`` (``size`` bytes as the agent sent it) of ``agent_id``; whether the fold is full now."""
        report = self._reports.get(agent_id)
        if isinstance(frame, Heartbeat):
            content = _content(frame)
            if report is None and self._told.get(agent_id) == content:
                if agent_id not in self._alive:
                    self.size += ALIVE_BYTES
                self._alive[agent_id] = frame
                return self.full
            self._told[agent_id] = content
            self.samples += 1
        else:
            self.samples += len(frame.samples) + (frame.host is not None)
        if report is None:
            report = self._reports[agent_id] = AgentReports(agent_id=agent_id, frames=[])
        report.frames.append(frame)
        self.size += size
        return self.full

    def renew(self, agent_id: str) -> None:
        """The agent starts a new session with the Master (its hello passed): the Master forgets what its heartbeats
        said, so the next one goes in full, and one waiting as alive goes in full too (first: it came first)."""
        self._told.pop(agent_id, None)
        beat = self._alive.pop(agent_id, None)
        if beat is not None:
            report = self._reports.get(agent_id)
            if report is None:
                report = self._reports[agent_id] = AgentReports(agent_id=agent_id, frames=[])
            report.frames.insert(0, beat)

    def forget(self, agent_id: str) -> None:
        """The agent left: its part of the waiting fold goes (the Master would not take it), and what it said."""
        self._told.pop(agent_id, None)
        self._alive.pop(agent_id, None)
        self._reports.pop(agent_id, None)

    def reset(self) -> None:
        """The Master may not have what was folded (a new link, a fold shed): every next heartbeat goes in full."""
        self._told.clear()

    def take(self) -> ReportFold | None:
        """The waiting fold, now on its way (None when nothing waits); the next one starts empty."""
        if not self._alive and not self._reports:
            return None
        fold = ReportFold(alive=list(self._alive), reports=list(self._reports.values()))
        self._clear()
        return fold

    def unfold(self) -> list[tuple[str, Heartbeat | Telemetry]]:
        """What waits, as the agents' own frames (agent id, frame), in each agent's order; the fold is emptied and
        everything told forgotten (these frames go to a Master that is not known to have anything)."""
        frames: list[tuple[str, Heartbeat | Telemetry]] = list(self._alive.items())
        for report in self._reports.values():
            frames.extend((report.agent_id, frame) for frame in report.frames)
        self._clear()
        self.reset()
        return frames

    def _clear(self) -> None:
        self._alive = {}
        self._reports = {}
        self.samples = 0
        self.size = 0
