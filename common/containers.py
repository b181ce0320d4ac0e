"""The bodies of the container commands (``create_container``: ``ContainerSpec``; ``delete_container``: ``DeleteSpec``),
validated in one place.

A body is typed from where it is made (the workload runner, the book, the API's raw commands) to the Master's command
ledger, which encodes it to the wire dict it signs (``wire_spec``) and checks it against its type's constraints there:
msgspec checks a field's ``Meta`` constraints when it decodes or converts, not when a struct is built directly (only
``__post_init__`` runs then). The agent parses the wire dict back (``parse_create_spec``, ``parse_delete_spec``)."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, ClassVar

import msgspec

from common.overlay import OverlaySpec
from common.storage import ContainerStorage

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}\Z")

LABEL_COMMAND_ID = "io.idlegrid.command-id"
LABEL_RENTAL_ID = "io.idlegrid.rental-id"
LABEL_AGENT_ID = "io.idlegrid.agent-id"
LABEL_NAME = "io.idlegrid.name"
LABEL_WORKLOAD_ID = "io.idlegrid.workload-id"  # the workload a replica's container belongs to
LABEL_REPLICA = "io.idlegrid.replica"  # which replica of it (0-based)
# The ports the workload declared, comma-separated: the only ports of the container a renter's tunnel may reach.
LABEL_PORTS = "io.idlegrid.ports"
RESERVED_LABEL_PREFIX = "io.idlegrid."
DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def registry_of(reference: str) -> str:
    """The registry host an image reference names, as the docker CLI reads it: a first component with a dot or a
    colon, or ``localhost``, is a registry; otherwise the image is Docker Hub's."""
    return _split_registry(reference.split("@", 1)[0])[0]


def _split_registry(name: str) -> tuple[str, str]:
    """A reference without its digest as (registry, path): ``ghcr.io/a/b:1`` is ("ghcr.io", "a/b:1")."""
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first.lower(), rest
    return DOCKER_HUB, name


def canonical_image(reference: str) -> str:
    """``reference`` as engines list it: its registry named (``docker.io`` for Docker Hub, whose official images are
    under ``library/``) and its tag (``latest`` unless it has a tag or a digest), so ``busybox`` and
    ``docker.io/library/busybox:latest`` are one image."""
    name, at, digest = reference.partition("@")
    registry, path = _split_registry(name)
    if registry in DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
        path = path if "/" in path else f"library/{path}"
    if not at and ":" not in path.rsplit("/", 1)[-1]:
        path += ":latest"
    return f"{registry}/{path}" + (f"@{digest}" if at else "")


def registry_matches(registry: str, pattern: str) -> bool:
    """Whether ``registry`` (``registry_of``'s) is what a host's setting ``pattern`` names: a host (with its port when
    it has one), ``*.domain`` for every host under that domain, or any of Docker Hub's names for Docker Hub."""
    pattern = pattern.strip().lower()
    if pattern.startswith("*."):
        return registry.endswith(pattern[1:])
    if pattern in DOCKER_HUB_ALIASES:
        return registry in DOCKER_HUB_ALIASES
    return registry == pattern


class RegistryAuth(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The renter's credentials for a private image's registry: a secret, like the env's values. The agent hands it
    to the engine (``X-Registry-Auth``) for one pull and never logs, stores or shows it; ``repr`` hides it."""

    username: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]  # a password or an access token

    def __repr__(self) -> str:
        return f"RegistryAuth(username={self.username!r}, password=<hidden>)"


class EndpointWorkerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The container is a worker of a serverless endpoint (docs/endpoints.md, "The agent's side"): the agent serves it
    the worker API and checks each call's bearer token against ``token``, a secret like the env's values (sealed in
    the stored command, master/command_secrets.py). The agent mints nothing: the token comes signed in the spec."""

    endpoint_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    worker_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    token: Annotated[str, msgspec.Meta(min_length=16, max_length=256)]
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1

    def __repr__(self) -> str:
        return f"EndpointWorkerSpec(endpoint_id={self.endpoint_id!r}, worker_id={self.worker_id!r}, token=<hidden>)"


class ContainerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a renter's container gets. GPUs are named by UUID (or index as a string)."""

    kind: ClassVar[str] = "create_container"  # the command that carries it: not a field, never on the wire

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")]
    image: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    command: list[str] = []
    env: dict[str, str] = {}
    gpus: list[str] = []
    cpus: Annotated[float, msgspec.Meta(gt=0, le=1024)] | None = None
    memory_mib: Annotated[int, msgspec.Meta(gt=4, le=16 * 1024 * 1024)] | None = None
    labels: dict[str, str] = {}
    rental_id: str | None = None
    workload_id: Annotated[str, msgspec.Meta(pattern=r"^wl-[0-9a-f]{1,60}\Z")] | None = None
    replica: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    # The ports the workload declared: the agent lets a port tunnel reach only these (agent/tunnel.py).
    ports: Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=65535)]], msgspec.Meta(max_length=64)] = []
    registry_auth: RegistryAuth | None = None  # for pulling a private image; absent: pulled anonymously
    overlay: OverlaySpec | None = None  # a gang replica's place on its private network (docs/overlay.md)
    storage: ContainerStorage | None = None  # inputs, outputs, checkpoint the agent moves (agent/storage/)
    endpoint_worker: EndpointWorkerSpec | None = None  # a serverless endpoint's worker: the agent serves it its API

    def __post_init__(self) -> None:
        for key in self.labels:
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label key {key!r} is not allowed")
            if key.startswith(RESERVED_LABEL_PREFIX):
                raise ValueError(f"label key {key!r} is reserved: labels under {RESERVED_LABEL_PREFIX} are set by idlegrid")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"environment variable name {key!r} is not allowed")


class DeleteSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which container a ``delete_container`` command stops and removes, and how long it has to stop."""

    kind: ClassVar[str] = "delete_container"

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")]
    timeout_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 10.0


# The body of a container command, one type per kind: the kind follows from the type (``spec.kind``).
CommandSpec = ContainerSpec | DeleteSpec
SPEC_OF_KIND: dict[str, type[ContainerSpec] | type[DeleteSpec]] = {spec.kind: spec for spec in typing.get_args(CommandSpec)}
# A command body as JSON (``wire_spec``): what the Master signs, sends and stores. A dict rather than the typed spec:
# the signature covers exactly these bytes, a stored record keeps what an older Master wrote, and a create's record
# holds it with its secret values sealed (master/command_secrets.py), which no longer parses as a ContainerSpec's env.
WireSpec = dict[str, Any]


def wire_spec(spec: CommandSpec) -> WireSpec:
    """The JSON body of the command for ``spec``: every field that differs from its default, and no other. The specs
    refuse fields they do not know, so a field left at its default is left out: an agent from before that field
    existed still accepts every spec that does not use it (``ports``, ``registry_auth``, the CPU and RAM shares). An
    older Master's body (every list and map written out, empty or not) parses the same. The dict is JSON as it is
    signed and sent: its values are open by nature (a renter's env, labels)."""
    body: WireSpec = {}
    for field in msgspec.structs.fields(spec):
        value = getattr(spec, field.name)
        if field.default is not msgspec.NODEFAULT:
            default = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = msgspec.NODEFAULT  # a required field: always written
        if value != default:
            body[field.encode_name] = msgspec.to_builtins(value)
    return body


def parse_create_spec(spec: WireSpec) -> ContainerSpec:
    """Validate a ``create_container`` spec as JSON carries it (the wire's dict); raises ``msgspec.ValidationError``
    with the reason."""
    return msgspec.convert(spec, ContainerSpec)


def parse_delete_spec(spec: WireSpec) -> DeleteSpec:
    return msgspec.convert(spec, DeleteSpec)


class ContainerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a runtime reports about a container it runs."""

    id: str
    name: str
    runtime: str
    state: str  # "running", "exited", "created", ...
    labels: dict[str, str] = {}
    exit_code: int | None = None
