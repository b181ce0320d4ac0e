"""What a reader of the README and of the demo's banner types, extracted as they do it, and replayed.

The README's shell sessions are the fenced blocks whose lines start with ``$ ``: each such line is a command (a line
ending in ``\\`` goes on in the next), and the lines after it, up to the next command, are a sample of what it prints.
A reader replaces the sample's ids (``wl-...``, ``agt-...``) with the ones their own commands printed; ``Session``
does the same: after each command it pairs every id of the sample with the id at the same place in the real output
(after the same words on a line, or on the table row whose next column says the same), and writes the real ones into
the commands that follow. Pure, so its parsing is tested without a grid (tests/test_readme_commands.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ID = re.compile(r"\b(?:wl|agt|sil|ep)-[0-9a-f]{8,}\b")
PROMPT = "$ "


@dataclass(frozen=True)
class Step:
    """One command of a README session and the sample output the README shows after it."""

    command: str
    sample: tuple[str, ...]
    heading: str  # the README section it is under ("### Try it as a renter")


def sessions(markdown: str) -> list[list[Step]]:
    """Every fenced block of ``markdown`` that holds ``$ `` commands, as its steps in order."""
    found: list[list[Step]] = []
    heading = ""
    block: list[str] | None = None
    for line in markdown.splitlines():
        if line.startswith("```"):
            if block is None:
                block = []
            else:
                steps = _steps(block, heading)
                if steps:
                    found.append(steps)
                block = None
            continue
        if block is not None:
            block.append(line)
        elif line.startswith("#"):
            heading = line.strip()
    return found


def _steps(lines: list[str], heading: str) -> list[Step]:
    steps: list[Step] = []
    command: list[str] = []
    sample: list[str] = []
    for line in lines:
        if line.startswith(PROMPT) and not (command and command[-1].endswith("\\")):
            if command:
                steps.append(Step(_joined(command), tuple(sample), heading))
            command, sample = [line.removeprefix(PROMPT)], []
        elif command and command[-1].endswith("\\"):
            command.append(line)
        elif command:
            sample.append(line)
    if command:
        steps.append(Step(_joined(command), tuple(sample), heading))
    return steps


def _joined(lines: list[str]) -> str:
    return "\n".join(lines)


def banner_lines(banner: str) -> dict[str, str]:
    """The renter's lines of the demo's banner: ``label: command`` by label, and ``export`` (the line a reader pastes
    first). Every line in the renter's part that is a command is here."""
    lines: dict[str, str] = {}
    inside = False
    for line in banner.splitlines():
        text = line.strip()
        if text.startswith("Rent a GPU as"):
            inside = True
            continue
        if inside and not line.startswith("    "):
            break
        if not inside:
            continue
        if text.startswith("export "):
            lines["export"] = text
        elif re.match(r"^[a-z][a-z0-9 ]*:\s+\S", text):
            label, command = text.split(":", 1)
            lines[label] = command.strip()
    return lines


@dataclass
class Session:
    """The ids a reader has learned so far: the README's sample id -> the one this run printed."""

    ids: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)  # other literal replacements (ports, paths)

    def typed(self, command: str) -> str:
        """``command`` as this reader types it: the ids and literals they learned written in."""
        for written, real in {**self.text, **self.ids}.items():
            command = command.replace(written, real)
        return command

    def _known(self, text: str) -> str:
        for sample, real in self.ids.items():
            text = text.replace(sample, real)
        return text

    def learn(self, sample: tuple[str, ...], output: str) -> None:
        """Pair each id of ``sample`` not yet known with the id at its place in ``output``."""
        actual = output.splitlines()
        for line in sample:
            for match in ID.finditer(line):
                token = match.group()
                if token in self.ids:
                    continue
                real = _same_place(self._known(line[: match.start()]) + line[match.start() :], token, actual)
                if real is not None:
                    self.ids[token] = real


def _same_place(line: str, token: str, actual: list[str]) -> str | None:
    """The id in ``actual`` at the place ``token`` has in ``line`` (a sample line, the ids before it already real)."""
    kind = token.split("-", 1)[0]
    pattern = re.compile(rf"\b{kind}-[0-9a-f]{{8,}}\b")
    before = line[: line.find(token)].strip()
    if before:  # after the same words: "submitted wl-... (hello)", "rented agt-...: workload wl-..."
        for candidate in actual:
            at = candidate.find(before)
            if at >= 0:
                found = pattern.search(candidate, at + len(before))
                if found:
                    return found.group()
        return None
    columns = line.split()
    if len(columns) < 2:
        return None
    for candidate in actual:  # a table row: the one whose next column says the same ("agt-...  l40s  4/4")
        cells = candidate.split()
        if len(cells) >= 2 and pattern.fullmatch(cells[0]) and cells[1] == columns[1]:
            return cells[0]
    return None
