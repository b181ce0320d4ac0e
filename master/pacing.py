"""How often agents should report: slower while telemetry is being shed anywhere, back to normal once it is not.

Sans I/O: ``ReportPacer.check(pressure, now)`` takes what was seen since the last check and returns the pace to
announce when it changed (the relay hub sends it to every relay as ``report_pace``, master/intake.py).

States: a factor ``f`` in [1, max_telemetry_factor], 1 when all is well. Telemetry goes every ``telemetry_s * f``;
heartbeats every ``heartbeat_s * min(f, max_heartbeat_factor)``: the Master judges silence on the configured
heartbeat interval times ``missed_heartbeats`` (master/agent_channel.py), so heartbeats may only slow down a little.

Rules, at each check (``check_s`` apart):
- pressure (telemetry replaced or evicted since the last check, at the Master or at a relay; or the intake's
  telemetry backlog past its coalescing bound at ``backlog_checks`` checks in a row): ``f`` doubles, up to the
  maximum. A backlog seen at one check only is a moment's stall (a minute's rollups, a collection), which the Master
  drains by itself: slowing ten thousand agents for it cost a quiet 10,000-agent run 40 % of its reports;
- ``calm_checks`` checks in a row without pressure: ``f`` shrinks by ``calm_step`` (x0.75), down to 1. Slowing
  down is fast and speeding up slow (as TCP's congestion window, the other way round): a pace that just kept up is
  left only gradually, so the load does not swing back past what the Master takes with every calm spell. From 8,
  back to 1 takes 8 calm spells (80 s by default);
- unless the Master has clear headroom: a check without pressure that finds the intake's handlers busy less than
  ``idle_busy`` (half) of the time since the last check shrinks ``f`` by ``calm_step`` at once. Reports 1/0.75 times
  as often raise that share to at most two thirds, so the step cannot overshoot; from 8, back to 1 takes 8 checks
  (16 s). A ramp or a storm (thousands of hellos at once) paces the fleet down, and the fleet is back to its normal
  pace seconds after the Master is idle again, not a minute later.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.lanes import LaneBounds
from master.config import MasterConfig


@dataclass(frozen=True, slots=True)
class PaceSettings:
    heartbeat_s: float = 5.0
    telemetry_s: float = 10.0
    max_telemetry_factor: float = 8.0
    max_heartbeat_factor: float = 1.5  # heartbeats 7.5 s apart at most by default: well inside 3 missed ones (15 s)
    check_s: float = 2.0
    calm_checks: int = 5
    calm_step: float = 0.75
    backlog_checks: int = 2  # checks in a row that must find the intake backlogged for it to count as pressure
    idle_busy: float = 0.5  # below this share of the time spent handling frames, a calm check steps back at once
    admit_agents_per_s: float = 400.0  # new agent sessions the Master admits per second, shared among its relays
    admit_burst: int = 400  # ... and at once


@dataclass(frozen=True, slots=True)
class Pace:
    heartbeat_s: float
    telemetry_s: float
    factor: float


@dataclass(frozen=True, slots=True)
class Pressure:
    """What was seen since the last check."""

    shed: int  # telemetry frames replaced or evicted (Master intake and relays together)
    backlogged: bool  # the intake's telemetry lane is past its coalescing bound now
    busy: float = 1.0  # share of the time since the last check the intake's handlers spent handling frames (all links)


class ReportPacer:
    def __init__(self, settings: PaceSettings) -> None:
        self.settings = settings
        self.factor = 1.0
        self._calm = 0
        self._backlogged = 0  # checks in a row that found the intake backlogged

    @property
    def pace(self) -> Pace:
        s = self.settings
        return Pace(
            heartbeat_s=s.heartbeat_s * min(self.factor, s.max_heartbeat_factor),
            telemetry_s=s.telemetry_s * self.factor,
            factor=self.factor,
        )

    def check(self, pressure: Pressure) -> Pace | None:
        """The new pace when it changed, else None."""
        before = self.factor
        self._backlogged = self._backlogged + 1 if pressure.backlogged else 0
        if pressure.shed > 0 or self._backlogged >= self.settings.backlog_checks:
            self._calm = 0
            self.factor = min(self.settings.max_telemetry_factor, self.factor * 2)
        else:
            self._calm += 1
            idle = pressure.busy < self.settings.idle_busy and not pressure.backlogged
            if (idle or self._calm >= self.settings.calm_checks) and self.factor > 1.0:
                self._calm = 0
                self.factor = max(1.0, round(self.factor * self.settings.calm_step, 3))
        return self.pace if self.factor != before else None


def pace_settings(config: MasterConfig) -> PaceSettings:
    return PaceSettings(
        heartbeat_s=config.heartbeat_s,
        telemetry_s=config.telemetry_s,
        max_telemetry_factor=config.max_report_slowdown,
        # heartbeats at most half the silence allowance apart, and never slowed more than telemetry
        max_heartbeat_factor=min(config.max_report_slowdown, max(1.0, config.missed_heartbeats / 2)),
        admit_agents_per_s=config.admit_agents_per_s,
        admit_burst=config.admit_burst,
    )


def intake_bounds(config: MasterConfig) -> LaneBounds:
    return LaneBounds(
        control_bytes=config.intake_control_bytes,
        telemetry_bytes=config.intake_telemetry_bytes,
        admission_bytes=config.intake_admission_bytes,
        coalesce_bytes=min(config.telemetry_coalesce_bytes, config.intake_telemetry_bytes),
    )
