"""``python -m bench.relay --tls-buffer-kib K ARGS``: the Access relay (``python -m access ARGS``) with asyncio's
TLS read buffer at K KiB instead of the relay's own setting, to measure what that buffer costs per connection."""

from __future__ import annotations

import sys

import access.daemon
from access.cli import main as access_main


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--tls-buffer-kib":
        print("usage: python -m bench.relay --tls-buffer-kib K [relay flags]", file=sys.stderr)
        return 2
    access.daemon.TLS_READ_BUFFER_BYTES = int(argv[1]) * 1024  # serve() applies it when the relay starts
    return access_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
