"""tests/support/singletons.py: the guard finds an overwritten one-character string, in a process of its own (the
overwrite is process-wide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.singletons import corrupted

ROOT = Path(__file__).resolve().parents[1]


def test_an_intact_process_has_every_one_character_string_as_it_was() -> None:
    assert corrupted() == []


def test_a_one_character_string_overwritten_in_place_is_named() -> None:
    # What CI saw, done on purpose: "~" (not " ", which the interpreter itself needs) overwritten with NUL through its
    # buffer, which starts where an empty string's terminator lies.
    code = (
        "import ctypes, sys\n"
        "from tests.support.singletons import corrupted\n"
        "ctypes.memmove(id(chr(0x7E)) + sys.getsizeof('') - 1, b'\\x00', 1)\n"
        "print(corrupted())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['0x7e -> 0x00']"


def test_the_test_during_which_it_happened_fails_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "test_overwrite.py").write_text(
        "import ctypes, sys\n"
        "def test_overwrites():\n"
        "    ctypes.memmove(id(chr(0x7E)) + sys.getsizeof('') - 1, b'\\x00', 1)\n"
        "def test_after_it():\n"
        "    pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "tests.support.singletons"]
        + ["-q", "--rootdir", str(tmp_path), str(tmp_path / "test_overwrite.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout
    assert "FAILED" in run.stdout and "test_overwrite.py::test_overwrites" in run.stdout and "1 passed" in run.stdout
    assert "0x7e -> 0x00" in run.stdout


def test_a_one_byte_bytes_overwritten_in_place_is_named() -> None:
    code = (
        "import ctypes, sys\n"
        "from tests.support.singletons import corrupted\n"
        "one = bytes(range(256))[0x7E:0x7F]\n"  # the shared b'~'
        "ctypes.memmove(id(one) + sys.getsizeof(b'') - 1, b'\\x00', 1)\n"
        "print(corrupted())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['b0x7e -> b0x00']"
