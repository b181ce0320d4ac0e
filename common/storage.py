"""Object storage in a workload: where its inputs, outputs and checkpoint live (S3-compatible), as the renter writes
them in the spec and as a host receives them in a create command. Shared by the Master (the spec, checked at submit)
and the agent (which moves the data: agent/storage/). docs/storage.md.

The spec names a credentials *secret* (the renter's secret store); the create command carries the resolved keys,
which only the host sees (``repr`` hides them, answers never show them).
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated

import msgspec

STORAGE_SCHEME = "s3://"
# Bucket names as S3 takes them (3-63 lowercase letters, digits, '.', '-'); keys up to 1024 bytes.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
MAX_KEY = 1024
DEFAULT_CHECKPOINT_PERIOD_S = 300.0
MIN_CHECKPOINT_PERIOD_S = 1.0  # short periods are for tests; a host bounds uploads by its own bandwidth anyway
MAX_CHECKPOINT_PERIOD_S = 86400.0
DEFAULT_CHECKPOINT_PATH = "/checkpoint"
# The environment a workload with a checkpoint finds (docs/storage.md).
ENV_CHECKPOINT_DIR = "IDLEGRID_CHECKPOINT_DIR"
ENV_RESTORED = "IDLEGRID_RESTORED"  # "1" when a checkpoint was restored before the command started
ENV_CHECKPOINT_TIME = "IDLEGRID_CHECKPOINT_TIME"  # the restored checkpoint's time (Unix seconds)
ENV_OUTPUT_DIR = "IDLEGRID_OUTPUT_DIR"  # the first output's directory, for programs that take one
ENV_INPUT_DIR = "IDLEGRID_INPUT_DIR"  # the first input's place
# The object beside a checkpoint's files that lists them; written last, so a checkpoint is whole or absent.
MANIFEST_NAME = ".idlegrid-checkpoint.json"

Uri = Annotated[str, msgspec.Meta(min_length=6, max_length=1100, pattern=r"^s3://[^\s]+\Z")]
ContainerPath = Annotated[str, msgspec.Meta(min_length=2, max_length=512, pattern=r"^/[^\0\s]*\Z")]
Endpoint = Annotated[str, msgspec.Meta(min_length=8, max_length=512, pattern=r"^https?://[^\s/]+(/[^\s]*)?\Z")]
Region = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+\Z")]
SecretName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")]


class InvalidLocation(ValueError):
    """A storage URI or container path that cannot be used; the message names it."""


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix"); InvalidLocation naming what is wrong."""
    if not uri.startswith(STORAGE_SCHEME):
        raise InvalidLocation(f"{uri!r} is not an s3:// URI (write s3://BUCKET/PREFIX)")
    bucket, _, key = uri[len(STORAGE_SCHEME) :].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise InvalidLocation(f"{uri!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.', '-')")
    if len(key.encode()) > MAX_KEY:
        raise InvalidLocation(f"{uri!r}: the key is longer than {MAX_KEY} bytes")
    if any(part in (".", "..") for part in key.split("/")):
        raise InvalidLocation(f"{uri!r}: '.' and '..' are not allowed in a key")
    return bucket, key


def clean_path(path: str) -> str:
    """A container path, normalised; InvalidLocation for one outside the container's own tree."""
    norm = posixpath.normpath(path)
    if not norm.startswith("/") or norm == "/" or ".." in path.split("/"):
        raise InvalidLocation(f"{path!r} is not a directory path in the container (absolute, not '/', no '..')")
    return norm


class StorageMount(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One location: ``uri`` (``s3://bucket/key`` for one object, ``s3://bucket/prefix/`` for every object under it)
    and where it appears in the container (``path``: the directory it is put in, or taken from)."""

    uri: Uri
    path: ContainerPath


class CheckpointSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The one checkpoint directory: restored before the command starts, uploaded every ``period_s`` (what changed)
    and at every stop the grid controls."""

    uri: Uri
    path: ContainerPath = DEFAULT_CHECKPOINT_PATH
    period_s: Annotated[float, msgspec.Meta(ge=MIN_CHECKPOINT_PERIOD_S, le=MAX_CHECKPOINT_PERIOD_S)] = DEFAULT_CHECKPOINT_PERIOD_S


class StorageAccess(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """How to reach the renter's object store: the endpoint (absent: AWS S3), the region, and the name of the renter's
    secret that holds the keys (``ACCESS_KEY_ID:SECRET_ACCESS_KEY``, or JSON with ``access_key_id``,
    ``secret_access_key`` and optionally ``session_token``)."""

    credentials: SecretName
    endpoint: Endpoint | None = None
    region: Region = "us-east-1"
    path_style: bool = True  # bucket in the path, as MinIO, Ceph and most S3-compatible stores want


class StorageCredentials(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The resolved keys, in a create command only: the host uses them and never logs or stores them."""

    access_key_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    secret_access_key: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    session_token: Annotated[str, msgspec.Meta(max_length=8192)] = ""

    def __repr__(self) -> str:
        return f"StorageCredentials(access_key_id={self.access_key_id!r}, secret_access_key=<hidden>)"


class ContainerStorage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a host needs to move a replica's data: where, with which keys, and the grace it has to stop."""

    credentials: StorageCredentials
    endpoint: Endpoint | None = None
    region: Region = "us-east-1"
    path_style: bool = True
    inputs: list[StorageMount] = []
    outputs: list[StorageMount] = []
    checkpoint: CheckpointSpec | None = None


class BadCredentials(ValueError):
    """A credentials secret that is not ``KEY_ID:SECRET`` nor the JSON form."""


def parse_credentials(value: str) -> StorageCredentials:
    """The keys in a credentials secret's value; BadCredentials (never quoting the value) for another shape."""
    text = value.strip()
    if text.startswith("{"):
        try:
            return msgspec.json.decode(text.encode(), type=StorageCredentials)
        except msgspec.ValidationError as exc:
            raise BadCredentials(f"the JSON form needs access_key_id and secret_access_key ({exc})") from None
        except msgspec.DecodeError:
            raise BadCredentials("it starts like JSON but is not JSON") from None
    key_id, sep, secret = text.partition(":")
    if not sep or not key_id or not secret:
        raise BadCredentials("write ACCESS_KEY_ID:SECRET_ACCESS_KEY, or JSON with access_key_id and secret_access_key")
    return StorageCredentials(access_key_id=key_id, secret_access_key=secret)


# Env values that name a secret: the whole value is ``${secret:NAME}``; anything else is taken literally.
SECRET_REF = re.compile(r"^\$\{secret:([A-Za-z0-9][A-Za-z0-9_.-]{0,62})\}\Z")


def secret_ref(value: str) -> str | None:
    """The secret an env value names (``${secret:NAME}``), else None."""
    match = SECRET_REF.match(value)
    return match.group(1) if match else None


STORAGE_ACTIVITIES = ("inputs_fetched", "checkpoint_restored", "checkpoint_uploaded", "outputs_uploaded", "upload_failed")


class StorageActivity(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A transfer a host made for a workload, reported to the Master (an agent event) and shown on the workload:
    ``what`` (one of STORAGE_ACTIVITIES), how many bytes moved, how long it took, and for a checkpoint when it was
    taken and how large it is whole (``total_bytes``). ``cached``: inputs the host's cache already had."""

    what: Annotated[str, msgspec.Meta(max_length=32)]
    workload_id: Annotated[str, msgspec.Meta(pattern=r"^wl-[0-9a-f]{1,60}\Z")] | None = None
    bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    total_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    files: Annotated[int, msgspec.Meta(ge=0)] = 0
    cached: Annotated[int, msgspec.Meta(ge=0)] = 0
    seconds: Annotated[float, msgspec.Meta(ge=0, le=1e7)] = 0.0
    taken_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)] = 0.0
    error: Annotated[str, msgspec.Meta(max_length=1024)] = ""
