"""SFTP whose filesystem is a container's (docs/ssh.md): ``ContainerFiles``, the SFTP server of the agent's SSH end
(agent/ssh_server.py).

Every operation is a small command run in the container through the runtime's exec (``stat``, ``cat``, ``tail -c``,
``mkdir``, ``mv``, ``rm``, ``ln``, ``chmod``, ``touch``, ``truncate``), with the paths as arguments, never pasted into a
script: paths resolve inside the container, in its mount namespace, as its user, so a symlink in the container cannot
lead to the host's files as a host-side chroot could. asyncssh's ``SFTPServer`` serves the local filesystem by
default: every one of its operations that would touch it is overridden here (tests/agent/test_ssh_server.py checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from agent.runtime.base import STDERR, ContainerRuntime, ExecSession
from agent.ssh_library import asyncssh
from common.errors import RuntimeFailure

MAX_OPEN_FILES = 16  # SFTP handles at once in one SFTP session: each may hold a streaming command in the container


class _Ran:
    def __init__(self, code: int, out: bytes, err: bytes) -> None:
        self.code, self.out, self.err = code, out, err


def _sftp_error(err: bytes, path: bytes) -> asyncssh.SFTPError:
    """The SFTP status a failed command's standard error means."""
    text = err.decode("utf-8", "replace").strip().splitlines()
    message = (text[-1] if text else "failed")[:300]
    lowered = message.lower()
    if "no such file" in lowered or "not found" in lowered:
        return asyncssh.SFTPNoSuchFile(message)
    if "permission denied" in lowered or "read-only" in lowered:
        return asyncssh.SFTPPermissionDenied(message)
    if "file exists" in lowered:
        return asyncssh.SFTPFileAlreadyExists(message)
    return asyncssh.SFTPFailure(message)


# The scripts each SFTP operation runs in the container, with the paths as arguments (never pasted into the script).
_STAT_FORMAT = "%s %f %u %g %X %Y"
_STAT = f"exec stat -L -c '{_STAT_FORMAT}' -- \"$1\""
_LSTAT = f"exec stat -c '{_STAT_FORMAT}' -- \"$1\""
_LIST = (
    'cd -- "$1" || exit 1\n'
    "for f in .* *; do\n"
    '  if [ -e "$f" ] || [ -L "$f" ]; then stat -c \'' + _STAT_FORMAT + ' %n\' -- "$f"; fi\n'
    "done"
)
_REALPATH = (
    'p="$1"\n'
    'if [ -d "$p" ]; then cd -- "$p" && exec pwd -P; fi\n'
    'd=$(dirname -- "$p"); b=$(basename -- "$p")\n'
    'cd -- "$d" 2>/dev/null || { printf "%s\\n" "$p"; exit 0; }\n'
    'w=$(pwd -P); [ "$w" = / ] && w=""; printf "%s/%s\\n" "$w" "$b"'
)
_MUST_EXIST = '[ -e "$1" ] || { echo "$1: No such file or directory" >&2; exit 1; }; '
_OPEN_WRITE = {
    # (create, truncate) -> the script making the file as asked before the first write
    (True, True): ': > "$1"',
    (True, False): ': >> "$1"',
    (False, True): _MUST_EXIST + ': > "$1"',
    (False, False): _MUST_EXIST + '[ -w "$1" ] || { echo "$1: Permission denied" >&2; exit 1; }',
}


_OPEN_READ = (
    '[ -d "$1" ] && { echo "$1: Is a directory" >&2; exit 1; }\n'
    'stat -L -c %s -- "$1" >/dev/null || exit 1\n'
    '[ -r "$1" ] || { echo "$1: Permission denied" >&2; exit 1; }'
)


def _attrs(fields: list[bytes]) -> asyncssh.SFTPAttrs:
    size, mode, uid, gid, atime, mtime = fields[:6]
    return asyncssh.SFTPAttrs(
        size=int(size), permissions=int(mode, 16), uid=int(uid), gid=int(gid), atime=int(atime), mtime=int(mtime)
    )


@dataclass
class _OpenFile:
    """An open SFTP handle: a file in the container, read or written in order through one streaming command."""

    path: bytes
    append: bool
    fresh: bool  # truncated (or appended to): the writer appends; otherwise it writes over from the start
    permissions: int | None
    reader: ExecSession | None = None
    read_at: int = 0  # the offset of ``buffer``'s first byte in the file
    buffer: bytearray = field(default_factory=bytearray)
    read_done: bool = False
    writer: ExecSession | None = None
    write_at: int = 0


class ContainerFiles(asyncssh.SFTPServer):
    """SFTP whose filesystem is the container's: each operation runs a small command in the container (as the
    container's user, inside its mount namespace), so no path is ever resolved on the host. Reads and writes stream
    through one ``cat`` each and go in order (what ``scp``, ``sftp get/put`` and ``rsync`` over SFTP do); a read that
    jumps starts the stream again at its offset; a write out of order is refused."""

    def __init__(self, chan: asyncssh.SSHServerChannel[bytes], runtime: ContainerRuntime, container: str) -> None:
        super().__init__(chan)
        self._runtime = runtime
        self._container = container
        self._open_files = 0

    async def _run(self, script: str, *args: bytes, stdin: bytes = b"") -> _Ran:
        argv = ["/bin/sh", "-c", script, "sh", *(a.decode("utf-8", "surrogateescape") for a in args)]
        try:
            session = await self._runtime.exec(self._container, argv, tty=False, cols=80, rows=24)
        except RuntimeFailure as exc:
            raise asyncssh.SFTPFailure(str(exc)[:300]) from None
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                await session.write(stdin)
            await session.close_stdin()
            while (chunk := await session.read()) is not None:
                (err if chunk[0] == STDERR else out).extend(chunk[1])
            code = await session.wait()
        finally:
            await session.close()
        return _Ran(code, bytes(out), bytes(err))

    async def _checked(self, script: str, *args: bytes) -> bytes:
        ran = await self._run(script, *args)
        if ran.code != 0:
            raise _sftp_error(ran.err, args[0] if args else b"")
        return ran.out

    def exit(self) -> None:
        """The client ended the session: end it with status 0, as OpenSSH's sftp-server exiting does (``scp`` and
        ``sftp`` count a session that ends with no status as failed)."""
        with contextlib.suppress(OSError, asyncssh.Error):
            self.channel.exit(0)

    # paths and attributes ---------------------------------------------------------------------------------------

    def map_path(self, path: bytes) -> bytes:
        return path or b"."

    async def realpath(self, path: bytes) -> bytes:
        return (await self._checked(_REALPATH, path or b".")).rstrip(b"\n") or b"/"

    async def stat(self, path: bytes) -> asyncssh.SFTPAttrs:
        return _attrs((await self._checked(_STAT, path)).split())

    async def lstat(self, path: bytes) -> asyncssh.SFTPAttrs:
        return _attrs((await self._checked(_LSTAT, path)).split())

    async def fstat(self, file_obj: object) -> asyncssh.SFTPAttrs:
        return await self.stat(self._file(file_obj).path)

    async def scandir(self, path: bytes) -> AsyncIterator[asyncssh.SFTPName]:
        for line in (await self._checked(_LIST, path)).splitlines():
            fields = line.split(b" ", 6)
            if len(fields) == 7:
                yield asyncssh.SFTPName(fields[6], attrs=_attrs(fields))

    async def setstat(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        if attrs.permissions is not None:
            await self._checked('exec chmod "$2" -- "$1"', path, b"%o" % (attrs.permissions & 0o7777))
        if attrs.mtime is not None:
            await self._checked('exec touch -m -d "@$2" -- "$1"', path, str(int(attrs.mtime)).encode())
        if attrs.size is not None:
            await self._checked('exec truncate -s "$2" -- "$1"', path, str(int(attrs.size)).encode())

    async def lsetstat(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        await self.setstat(path, attrs)

    async def fsetstat(self, file_obj: object, attrs: asyncssh.SFTPAttrs) -> None:
        handle = self._file(file_obj)
        await self._finish_writing(handle)  # what was written lands before its attributes change
        await self.setstat(handle.path, attrs)

    def format_user(self, uid: int | None) -> str:
        return str(uid) if uid is not None else ""  # the container's names are not the host's: ids only

    def format_group(self, gid: int | None) -> str:
        return str(gid) if gid is not None else ""

    def statvfs(self, path: bytes) -> asyncssh.SFTPVFSAttrs:
        raise asyncssh.SFTPOpUnsupported("statvfs is not served for a container's files")

    def fstatvfs(self, file_obj: object) -> asyncssh.SFTPVFSAttrs:
        raise asyncssh.SFTPOpUnsupported("statvfs is not served for a container's files")

    # names --------------------------------------------------------------------------------------------------------

    async def remove(self, path: bytes) -> None:
        await self._checked('[ -d "$1" ] && [ ! -L "$1" ] && { echo "$1: Is a directory" >&2; exit 1; }; exec rm -- "$1"', path)

    async def mkdir(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        await self._checked('exec mkdir -- "$1"', path)
        if attrs.permissions is not None:
            await self.setstat(path, asyncssh.SFTPAttrs(permissions=attrs.permissions))

    async def rmdir(self, path: bytes) -> None:
        await self._checked('exec rmdir -- "$1"', path)

    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self._checked(
            '[ -e "$2" ] || [ -L "$2" ] && { echo "$2: File exists" >&2; exit 1; }; exec mv -- "$1" "$2"', oldpath, newpath
        )

    async def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self._checked('exec mv -f -- "$1" "$2"', oldpath, newpath)

    async def readlink(self, path: bytes) -> bytes:
        return (await self._checked('exec readlink -- "$1"', path)).rstrip(b"\n")

    async def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        await self._checked('exec ln -s -- "$1" "$2"', oldpath, newpath)

    async def link(self, oldpath: bytes, newpath: bytes) -> None:
        await self._checked('exec ln -- "$1" "$2"', oldpath, newpath)

    # files --------------------------------------------------------------------------------------------------------

    @staticmethod
    def _file(file_obj: object) -> _OpenFile:
        if not isinstance(file_obj, _OpenFile):
            raise asyncssh.SFTPInvalidHandle("not a handle this server made")
        return file_obj

    async def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> _OpenFile:
        if self._open_files >= MAX_OPEN_FILES:
            raise asyncssh.SFTPFailure(f"{self._open_files} files are open in this session, the most it may; close one")
        handle = await self._open(path, pflags, attrs)
        self._open_files += 1
        return handle

    async def _open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> _OpenFile:
        writing = bool(pflags & (asyncssh.FXF_WRITE | asyncssh.FXF_APPEND))
        if not writing:
            await self._checked(_OPEN_READ, path)
            return _OpenFile(path, append=False, fresh=False, permissions=None)
        if pflags & asyncssh.FXF_EXCL:
            await self._checked('[ -e "$1" ] || [ -L "$1" ] && { echo "$1: File exists" >&2; exit 1; }; : > "$1"', path)
        else:
            create, truncate = bool(pflags & asyncssh.FXF_CREAT), bool(pflags & asyncssh.FXF_TRUNC)
            await self._checked(_OPEN_WRITE[(create, truncate)], path)
        append = bool(pflags & asyncssh.FXF_APPEND)
        fresh = append or bool(pflags & (asyncssh.FXF_TRUNC | asyncssh.FXF_EXCL))
        return _OpenFile(path, append=append, fresh=fresh, permissions=attrs.permissions)

    async def read(self, file_obj: object, offset: int, size: int) -> bytes:
        handle = self._file(file_obj)
        end = handle.read_at + len(handle.buffer)
        if handle.read_done and offset >= end:
            return b""  # past the end: EOF, with no command run again
        if handle.reader is None or not handle.read_at <= offset <= end:
            await self._start_reading(handle, offset)
        del handle.buffer[: offset - handle.read_at]
        handle.read_at = offset
        while len(handle.buffer) < size and not handle.read_done:
            assert handle.reader is not None
            chunk = await handle.reader.read()
            if chunk is None:
                handle.read_done = True
                code = await handle.reader.wait()
                if code != 0 and not handle.buffer:
                    raise asyncssh.SFTPFailure(f"reading {handle.path.decode(errors='replace')} failed (status {code})")
            elif chunk[0] != STDERR:
                handle.buffer.extend(chunk[1])
        return bytes(handle.buffer[:size])

    async def _start_reading(self, handle: _OpenFile, offset: int) -> None:
        if handle.reader is not None:
            await handle.reader.close()
        argv = [
            "/bin/sh",
            "-c",
            'exec tail -c "+$2" -- "$1"',
            "sh",
            handle.path.decode("utf-8", "surrogateescape"),
            str(offset + 1),
        ]
        try:
            handle.reader = await self._runtime.exec(self._container, argv, tty=False, cols=80, rows=24)
        except RuntimeFailure as exc:
            raise asyncssh.SFTPFailure(str(exc)[:300]) from None
        await handle.reader.close_stdin()
        handle.buffer.clear()
        handle.read_at, handle.read_done = offset, False

    async def write(self, file_obj: object, offset: int, data: bytes) -> int:
        handle = self._file(file_obj)
        if not handle.append and offset != handle.write_at:
            raise asyncssh.SFTPOpUnsupported(
                f"writes go in order in a container's file: expected offset {handle.write_at}, got {offset}"
            )
        if handle.writer is None:
            script = 'exec cat >> "$1"' if handle.fresh else 'exec cat 1<> "$1"'
            argv = ["/bin/sh", "-c", script, "sh", handle.path.decode("utf-8", "surrogateescape")]
            try:
                handle.writer = await self._runtime.exec(self._container, argv, tty=False, cols=80, rows=24)
            except RuntimeFailure as exc:
                raise asyncssh.SFTPFailure(str(exc)[:300]) from None
        try:
            await handle.writer.write(data)
        except OSError as exc:
            raise asyncssh.SFTPFailure(f"writing {handle.path.decode(errors='replace')} failed: {exc}") from None
        handle.write_at = offset + len(data)
        return len(data)

    async def _finish_writing(self, handle: _OpenFile) -> None:
        writer, handle.writer = handle.writer, None
        if writer is None:
            return
        err = bytearray()
        try:
            await writer.close_stdin()
            while (chunk := await writer.read()) is not None:
                if chunk[0] == STDERR:
                    err.extend(chunk[1])
            code = await writer.wait()
        finally:
            await writer.close()
        if code != 0:
            raise _sftp_error(bytes(err), handle.path)
        handle.fresh = True  # what follows is appended after what was written

    async def fsync(self, file_obj: object) -> None:
        await self._finish_writing(self._file(file_obj))

    def lock(self, file_obj: object, offset: int, length: int, flags: int) -> None:
        raise asyncssh.SFTPOpUnsupported("byte-range locks are not served for a container's files")

    def unlock(self, file_obj: object, offset: int, length: int) -> None:
        raise asyncssh.SFTPOpUnsupported("byte-range locks are not served for a container's files")

    def open56(self, path: bytes, desired_access: int, flags: int, attrs: asyncssh.SFTPAttrs) -> object:
        raise asyncssh.SFTPOpUnsupported("SFTP version 5 and later opens are not served; OpenSSH speaks version 3")

    async def close(self, file_obj: object) -> None:
        handle = self._file(file_obj)
        self._open_files = max(0, self._open_files - 1)
        if handle.reader is not None:
            await handle.reader.close()
            handle.reader = None
        await self._finish_writing(handle)
        if handle.permissions is not None:
            await self.setstat(handle.path, asyncssh.SFTPAttrs(permissions=handle.permissions))
