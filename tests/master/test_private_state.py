"""``make_private``: what it closes, and what it leaves alone."""

from __future__ import annotations

import stat
from pathlib import Path

from master.private_state import make_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_state_directory_is_closed_but_a_link_out_of_it_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "pki").mkdir(parents=True, mode=0o755)
    state.chmod(0o755)
    (state / "master.db").write_bytes(b"")
    (state / "master.db").chmod(0o644)
    (state / "pki" / "ca.crt").write_bytes(b"")
    (state / "pki" / "ca.crt").chmod(0o644)
    (state / "owner-only").write_bytes(b"")
    (state / "owner-only").chmod(0o400)
    outside = tmp_path / "shared.txt"
    outside.write_bytes(b"")
    outside.chmod(0o644)
    (state / "link").symlink_to(outside)

    closed = make_private(state)

    assert sorted(p.relative_to(state).as_posix() for p in closed) == [".", "master.db", "pki", "pki/ca.crt"]
    assert (mode(state), mode(state / "pki"), mode(state / "master.db"), mode(state / "pki" / "ca.crt")) == (
        0o700,
        0o700,
        0o600,
        0o600,
    )
    assert mode(state / "owner-only") == 0o400  # nothing in it for others: left as it is
    assert mode(outside) == 0o644  # the link's target is not the Master's
    assert make_private(state) == []  # nothing left to close
    fresh = tmp_path / "new" / "state"
    make_private(fresh)
    assert mode(fresh) == 0o700
