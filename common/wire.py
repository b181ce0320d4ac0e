"""Wire protocol v1: every frame between agent, Access relay and Master, and the one codec for them.

Frames are JSON objects with a ``type`` tag, sent as WebSocket text messages. Agent frames travel
unchanged through the relay inside a ``relay`` envelope that names the agent; the relay sets that
name from the agent's certificate, so an agent never chooses whose frames it sends.

Each frame a relay queues for the Master declares here, beside its fields, the lane it waits in (``lane``:
common/lanes.py) and whether the relay's per-connection budget may refuse it (``rate_limited``). The relay
(access/relay.py, access/upstream.py) and the Master's intake (master/intake.py) read ``LANE_OF_KIND``,
``TELEMETRY_KINDS`` and ``NEVER_RATE_LIMITED``, derived from those declarations; a queued frame without a lane fails
the import (``lanes_of``) and tests/test_frame_lanes.py.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, get_args

import msgspec

from common.errors import ProtocolError
from common.inventory import GpuSample, HostSample, Inventory, LongText, ShortText
from common.lanes import Lane
from common.storage import StorageActivity
from common.tunnel import Ticket

PROTOCOL_VERSIONS: tuple[int, ...] = (1,)
MAX_FRAME_BYTES = 256 * 1024  # protocol limit: larger frames get an ``error`` frame
HARD_FRAME_BYTES = 4 * 1024 * 1024  # transport limit: larger messages close the connection (1009)


# WebSocket close codes a relay or the Master closes a connection with (RFC 6455 keeps 4000-4999 for applications).
CLOSE_POLICY = 4003  # this certificate may not be here: wrong role, revoked, expired
CLOSE_REVOKED = 4004  # this certificate is revoked: the agent must enroll again, retrying cannot help
CLOSE_REPLACED = 4008  # the same agent connected again; the newer connection wins
CLOSE_SILENT = 4010  # no frame for max_silence_s
# A Master that does not lead (a standby, or one stepping down: docs/ha.md) refuses or closes a relay's link with this;
# the reason is the leader's link URL when it knows it ("" when not), where the relay dials next.
CLOSE_NOT_LEADER = 4011
CLOSE_FLOOD = 1008  # policy violation: kept sending far over the rate limit after being told
# Tunnels (common/tunnel.py): why a relay closes one end of a data WebSocket.
CLOSE_TICKET_REFUSED = 4020  # the ticket is malformed, forged, expired, used already, or for another relay or agent
CLOSE_TUNNEL_UNMET = 4021  # the other end did not arrive before the ticket expired
CLOSE_TUNNEL_PEER_GONE = 4022  # the other end went away; the reason names why when it is known
CLOSE_TUNNEL_LIMIT = 4023  # this relay (or this agent) has as many tunnels open as it allows
CLOSE_TUNNEL_BAD_FRAME = 4024  # a message that is not a tunnel frame, or larger than one may be
CLOSE_TUNNEL_IDLE = 4025  # no byte either way for the agent's tunnel_idle_timeout_s: the slot goes to others


class ErrorCode(str, enum.Enum):
    BAD_JSON = "bad_json"
    UNKNOWN_TYPE = "unknown_type"
    FRAME_TOO_LARGE = "frame_too_large"
    SCHEMA_VIOLATION = "schema_violation"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNEXPECTED_FRAME = "unexpected_frame"
    RATE_LIMITED = "rate_limited"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"
    HELLO_REQUIRED = "hello_required"  # this Master process does not know the agent yet: send hello first
    INVENTORY_TOO_LARGE = "inventory_too_large"  # a hello listed more GPUs than the Master takes from one host


class _Frame(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    # Every frame a relay queues for the Master declares its ``lane: ClassVar[Lane]`` (no default: a new frame must
    # choose). Control must all arrive, in order; admission (hellos) comes after the control of agents already in;
    # telemetry says only what its newest frame says, so an older one waiting may be replaced or let go.
    # The relay's budget may refuse an agent's frame unless it says otherwise here.
    rate_limited: ClassVar[bool] = True


# --- agent -> master -------------------------------------------------------------------------


class Hello(_Frame, tag="hello"):
    lane: ClassVar[Lane] = Lane.ADMISSION  # a storm's hellos must not hold back the results of agents already in
    versions: list[int]
    agent_version: str
    inventory: Inventory
    region: str = ""
    command_keys: list[str] = []  # key ids the agent trusts; lets the master notice stale agents
    # The GPU benchmark this agent answers verification challenges with: "cuda", "simulated", or "" (none: its GPUs
    # are never challenged and stay unmeasured, as with agents older than verification).
    benchmark: ShortText = ""
    # The challenge forms (common/challenge.py FORMS) that benchmark answers besides "sum", which every benchmark
    # answers: "rounds", sized by the claimed card's speed. Empty for agents older than the rounds form.
    challenge_forms: Annotated[list[ShortText], msgspec.Meta(max_length=8)] = []


class Heartbeat(_Frame, tag="heartbeat"):
    lane: ClassVar[Lane] = Lane.TELEMETRY
    seq: int
    ts: float
    running: list[str] = []  # names of containers the agent runs
    # Containers that ended on their own and are not deleted yet, name -> exit status; repeated in every heartbeat
    # until deleted, so an exit seen while the link or the Master was down still arrives. Omitted when empty.
    exited: dict[ShortText, int] = {}
    ping: str | None = None  # echoes the nonce of the last ``ping``
    # Gang replicas' overlays (docs/overlay.md): container -> peer overlay address -> "direct" or "relay", as the
    # agent's overlay clients see them now. Omitted when the host runs none.
    overlay: Annotated[
        dict[ShortText, Annotated[dict[ShortText, ShortText], msgspec.Meta(max_length=1024)]], msgspec.Meta(max_length=64)
    ] = {}


class Telemetry(_Frame, tag="telemetry"):
    lane: ClassVar[Lane] = Lane.TELEMETRY
    ts: float
    samples: list[GpuSample]
    host: HostSample | None = None  # the host's own CPU, memory, disk and network (agents older than it send none)


class CommandAck(_Frame, tag="command_ack"):
    lane: ClassVar[Lane] = Lane.CONTROL
    rate_limited: ClassVar[bool] = False  # see CommandResult
    id: str


class CommandResult(_Frame, tag="command_result"):
    lane: ClassVar[Lane] = Lane.CONTROL
    # The agent resends a result until acked anyway, but refusing it would only delay the Master's view of what
    # really happened to a command.
    rate_limited: ClassVar[bool] = False
    id: str
    ok: bool
    result: dict[str, Any] = {}
    error: str | None = None
    error_code: str | None = None  # e.g. "bad_signature", "runtime_failure", "deadline_passed"


class AgentEventKind(str, enum.Enum):
    """What an agent can truly report about its own host: a closed set, nothing else is taken."""

    CONTAINER_EXITED = "container_exited"  # a renter's container ended on its own (code = exit status)
    GPU_XID = "gpu_xid"  # the driver reported an Xid error (code = the Xid number)
    GPU_ECC = "gpu_ecc"  # uncorrectable ECC errors (code = count since the last report)
    GPU_THROTTLED = "gpu_throttled"  # clocks held down (message = the throttle reasons)
    RUNTIME_FAILURE = "runtime_failure"  # the container engine failed or went away
    IMAGE_PULL = "image_pull"  # a create's image pull moved on (container; message = "pulling image: ... of ...")
    STORAGE = "storage"  # a workload's data moved: inputs, a checkpoint restored or uploaded, outputs (``storage``)


class AgentEvent(_Frame, tag="event"):
    """An agent's report of something on its host. Stored under the agent's own subject in the
    ``agent_report.`` namespace, never as a Master transition or an operator's action."""

    lane: ClassVar[Lane] = Lane.CONTROL
    kind: AgentEventKind
    ts: float
    container: ShortText | None = None
    gpu_uuid: ShortText | None = None
    code: int | None = None
    message: LongText = ""
    storage: StorageActivity | None = None  # with kind ``storage``: what moved (common/storage.py)


class RelayEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One Access relay linked to the Master: what an agent needs to fail over to it."""

    relay_id: ShortText
    region: ShortText
    url: Annotated[str, msgspec.Meta(max_length=512)]  # wss://HOST:PORT an agent dials


class RenewRequest(_Frame, tag="renew_request"):
    """A fresh CSR for the agent's next certificate, sent over the authenticated link before expiry."""

    lane: ClassVar[Lane] = Lane.CONTROL
    csr_pem: str


class BenchmarkFigures(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the agent's benchmark measured on one GPU (agent/benchmark/). Its own word: the Master trusts them only
    beside a challenge it checked (master/verification.py). A figure the benchmark could not measure is None."""

    fp32_tflops: float | None = None
    fp16_tflops: float | None = None  # dense, tensor cores where the card has them
    bf16_tflops: float | None = None
    memory_bandwidth_gbs: float | None = None  # device copy, read + write
    h2d_gbs: float | None = None  # pinned host to device
    d2h_gbs: float | None = None
    allocatable_mib: int | None = None  # allocated and written
    duration_s: float = 0.0  # the whole benchmark, challenge included
    simulated: bool = False  # figures of a simulated GPU (agent/benchmark/simulated.py), never shown as verified


class VerifyCommit(_Frame, tag="verify_commit"):
    """The answer to a ``verify_challenge``: the Merkle root over the answer's rows (common/challenge.py) and the
    benchmark's figures; or ``refused`` (why the benchmark did not run: the GPU is held by a renter, ...)."""

    lane: ClassVar[Lane] = Lane.CONTROL
    challenge_id: ShortText
    root: ShortText = ""
    figures: BenchmarkFigures | None = None
    refused: LongText = ""


class VerifyOpening(msgspec.Struct, kw_only=True):
    row: int
    values: list[int]
    path: list[ShortText]


class VerifyOpen(_Frame, tag="verify_open"):
    """The rows a ``verify_reveal`` named, each with its authentication path to the committed root."""

    lane: ClassVar[Lane] = Lane.CONTROL
    challenge_id: ShortText
    openings: list[VerifyOpening]


class WorkerOp(str, enum.Enum):
    """The calls of an endpoint worker's API (common/endpoint_worker/contract.py), and ``gone``: the agent's word that
    the worker's container ended or is lost, so its requests go back to the queue."""

    TAKE = "take"
    HEARTBEAT = "heartbeat"
    PARTIAL = "partial"
    PROGRESS = "progress"
    RESULT = "result"
    ERROR = "error"
    RELEASE = "release"
    RESULTS = "results"  # several results in one call: payload [{"id", "output"}, ...]
    GONE = "gone"


MAX_WORKER_TAKE_WAIT_S = 30.0  # a take's long poll, at most: the agent caps what a worker asks
MAX_WORKER_TAKE_MOST = 1000  # requests one take may ask for (an endpoint's per-worker concurrency, at most)
MAX_WORKER_IN_FLIGHT = 1024  # request ids one heartbeat names


class WorkerResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One result of a ``results`` call (its payload is a list of them, 1 to MAX_WORKER_IN_FLIGHT): the request's id
    and its output. The agent checks a worker's body against it, and the Master the frame's payload."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    output: Any


WorkerResults = Annotated[list[WorkerResult], msgspec.Meta(min_length=1, max_length=MAX_WORKER_IN_FLIGHT)]


class WorkerCall(_Frame, tag="worker_call"):
    """One call of an endpoint worker in a container of this host, carried to the Master (docs/endpoints.md, "The
    agent's side"); the Master answers with a ``worker_answer`` of the same ``call_id`` (``gone`` has no answer).
    The agent checked the worker's token against its container's signed spec; the Master checks that this agent is
    the one that container was created on. ``payload`` is the output, the progress or the error; the frame's size
    bounds it (a body larger than a frame is refused by the agent with 413)."""

    lane: ClassVar[Lane] = Lane.CONTROL
    call_id: ShortText
    container: ShortText
    endpoint_id: ShortText
    worker_id: ShortText
    op: WorkerOp
    request_id: ShortText = ""
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_WORKER_TAKE_WAIT_S)] = 0.0
    # A take of up to this many requests, answered {"requests": [...]}; 0: a take of one, answered as the request
    # itself (the form of an agent or a handler library from before the batch take)
    most: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORKER_TAKE_MOST)] = 0
    in_flight: Annotated[list[ShortText], msgspec.Meta(max_length=MAX_WORKER_IN_FLIGHT)] = []
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    payload: Any = None


# A report interval the Master sets: a positive number of seconds, at most a week (the Master's own settings allow
# an hour, slowed at most 64 times under overload). An agent told 0, a negative number, NaN or infinity would report
# in a tight loop or never: such a frame is refused at decode.
MAX_REPORT_INTERVAL_S = 7 * 86_400
ReportInterval = Annotated[float, msgspec.Meta(gt=0, le=MAX_REPORT_INTERVAL_S)]
# In a config frame 0 means "keep the interval you have" (a frame about keys names none).
IntervalChange = Annotated[float, msgspec.Meta(ge=0, le=MAX_REPORT_INTERVAL_S)]


# --- master -> agent -------------------------------------------------------------------------


class Welcome(_Frame, tag="welcome"):
    version: int
    agent_id: str
    heartbeat_s: ReportInterval
    telemetry_s: ReportInterval
    command_keys: dict[str, str] = {}  # key id -> Ed25519 public key, base64
    key_endorsements: dict[str, str] = {}  # key id -> the platform CA's signature over the key
    retired_keys: list[str] = []
    relays: list[RelayEntry] = []  # the relay directory at the time of the welcome


class CommandBody(msgspec.Struct, kw_only=True):
    """The signed part of a command. Its signature covers ``signing_bytes(body)``."""

    id: str
    agent_id: str
    kind: str
    spec: dict[str, Any]
    issued_at: float
    deadline: float
    key_id: str


class Command(_Frame, tag="command"):
    body: CommandBody
    signature: str


class TunnelOpen(_Frame, tag="tunnel_open"):
    """Dial the relay the ticket names and serve its tunnel (common/tunnel.py); the agent checks the ticket first."""

    ticket: Ticket


class ResultAck(_Frame, tag="result_ack"):
    id: str


class Ping(_Frame, tag="ping"):
    nonce: str


class Config(_Frame, tag="config"):
    heartbeat_s: IntervalChange | None = None
    telemetry_s: IntervalChange | None = None
    command_keys: dict[str, str] | None = None
    key_endorsements: dict[str, str] | None = None
    retired_keys: list[str] | None = None


class RelayDirectory(_Frame, tag="relay_directory"):
    """Every relay linked to the Master now; sent to every agent whenever a relay comes or goes.

    An agent fails over along it (nearest region first) when DNS gives it nothing better.
    """

    relays: list[RelayEntry]


class RenewResponse(_Frame, tag="renew_response"):
    cert_pem: str = ""
    error: str = ""


# The verification challenge's forms (common/challenge.py defines what each answer is).
CHALLENGE_FORM_SUM = "sum"
CHALLENGE_FORM_ROUNDS = "rounds"


class VerifyChallenge(_Frame, tag="verify_challenge"):
    """Benchmark this GPU and answer the challenge (common/challenge.py): commit to the answer by ``deadline``.

    ``sim_rate_scale`` only slows a simulated GPU (the local grid's time scale); a real GPU ignores it. ``form`` says
    what the answer is: the sum of the rounds' products, or one digest per round (common/challenge.py)."""

    challenge_id: ShortText
    gpu_uuid: ShortText
    seed: int
    n: int
    k: int
    rounds: int
    deadline: float  # the Master's clock; the Master judges lateness by its own clock, this is a hint
    sim_rate_scale: float = 1.0
    form: ShortText = CHALLENGE_FORM_SUM  # CHALLENGE_FORM_ROUNDS only to an agent whose hello named it


class VerifyReveal(_Frame, tag="verify_reveal"):
    """The rows of the committed answer the Master will check, named only after the commit arrived."""

    challenge_id: ShortText
    rows: list[int]


class WorkerAnswer(_Frame, tag="worker_answer"):
    """The Master's answer to a ``worker_call``: the HTTP status and JSON body the agent gives the worker as they are
    (the contract's: 200 with a body, 204, 404/409 a request gone, 413, 503 when no queue is there)."""

    call_id: ShortText
    status: Annotated[int, msgspec.Meta(ge=100, le=599)]
    body: Any = None


class RelayStatus(_Frame, tag="relay_status"):
    """Sent by the Access relay itself: whether it can reach the Master right now."""

    master_link: str  # "up" | "down"
    buffered: int = 0


class Error(_Frame, tag="error"):
    lane: ClassVar[Lane] = Lane.CONTROL
    code: str
    message: str
    ref: str | None = None  # id of the frame or command it refers to, when known


AgentFrame = (
    Hello
    | Heartbeat
    | Telemetry
    | CommandAck
    | CommandResult
    | AgentEvent
    | RenewRequest
    | VerifyCommit
    | VerifyOpen
    | WorkerCall
    | Error
)
MasterFrame = (
    Welcome
    | Command
    | ResultAck
    | Ping
    | Config
    | RelayDirectory
    | RenewResponse
    | RelayStatus
    | TunnelOpen
    | VerifyChallenge
    | VerifyReveal
    | WorkerAnswer
    | Error
)


# --- access <-> master -----------------------------------------------------------------------


class AccessHello(_Frame, tag="access_hello"):
    versions: list[int]
    relay_id: str
    region: str
    public_url: str = ""
    http_url: str = ""  # https://HOST:PORT renters reach the relay's HTTPS port at (tunnels); "" from older relays
    # The relay takes ``DirectoryNews`` and passes it on to its agents; an older relay leaves this out and its agents
    # get one ``relay_directory`` frame each through the link.
    directory_news: bool = False
    # The relay folds its agents' heartbeats and telemetry into one ``report_fold`` per interval when the Master takes
    # them; an older relay leaves this out and sends each agent frame in its own ``relay`` envelope, as before.
    folds: bool = False
    # The relay takes a JSON array of link frames from the Master as one message (in order, as if sent one by one); an
    # older relay leaves this out and gets one frame per message.
    batches: bool = False


class AccessWelcome(_Frame, tag="access_welcome"):
    version: int
    revoked_serials: list[str] = []
    # The Master takes a JSON array of link frames as one message (in order, as if sent one by one). A relay sends
    # arrays only when told so: an older Master, which leaves this out, gets one frame per message.
    batches: bool = False
    # The Master takes ``report_fold`` frames. A relay folds only when told so: an older Master, which leaves this out,
    # gets each heartbeat and telemetry frame on its own, as before.
    folds: bool = False


class DirectoryNews(_Frame, tag="directory_news"):
    """Master -> relay: the relay directory changed; the relay tells each of its agents (a ``relay_directory``
    frame) with the agent's next frame, and each agent welcomed later has it in its welcome.

    One frame per relay instead of one per agent: 5,000 directory frames (1.2 MB) sent at once through a link sat
    before every command behind them for seconds while the relay drained them in a reconnect storm."""

    relays: list[RelayEntry]


class Relay(_Frame, tag="relay"):
    """An agent frame in transit; ``frame`` is the agent frame's JSON, untouched."""

    agent_id: str
    frame: msgspec.Raw


class AgentReports(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One agent's part of a fold: its heartbeats and telemetry of the interval that say something the Master has not
    heard from it already, in the order the agent sent them (every telemetry sample, every change of its heartbeat)."""

    agent_id: str
    frames: list[Heartbeat | Telemetry] = []


class ReportFold(_Frame, tag="report_fold"):
    """Relay -> Master: its agents' heartbeats and telemetry of one interval (access/fold.py), in one frame instead of
    one each, so that the Master pays per relay frame rather than per agent frame (docs/access.md, "Folding").

    ``alive`` names the agents whose heartbeat in the interval, before any other frame of theirs in it, said nothing the
    Master does not have already (running containers, exits, overlay paths and ping echo as in its last full one):
    liveness alone. ``reports`` holds the rest, a delta, each agent's frames in order after its ``alive`` mark. The
    Master unfolds it into what the same frames one by one would have done (master/agent_channel.py ``_on_reports``).
    Only to a Master whose ``access_welcome`` said ``folds``."""

    lane: ClassVar[Lane] = Lane.TELEMETRY
    alive: list[str] = []
    reports: list[AgentReports] = []


class AgentConnected(_Frame, tag="agent_connected"):
    lane: ClassVar[Lane] = Lane.CONTROL
    agent_id: str
    serial: str
    cert_not_after: float
    remote: str = ""


class AgentDisconnected(_Frame, tag="agent_disconnected"):
    lane: ClassVar[Lane] = Lane.CONTROL
    agent_id: str
    reason: str = ""


class Revocations(_Frame, tag="revocations"):
    serials: list[str]


class AccessStats(_Frame, tag="access_stats"):
    agents: int
    frames_in: int
    frames_out: int
    buffered: int
    refused: int
    # Telemetry the relay let go (superseded by a newer one of the same agent, or evicted to stay under its byte
    # bound) since it started; the Master slows reporting down while this grows (master/pacing.py).
    telemetry_shed: int = 0
    telemetry_bytes: int = 0  # telemetry waiting in the relay's buffer now


class EnrollRequest(_Frame, tag="enroll_request"):
    req_id: str
    token: str
    csr_pem: str
    region: str = ""
    remote: str = ""


class EnrollResponse(_Frame, tag="enroll_response"):
    req_id: str
    ok: bool
    agent_id: str = ""
    cert_pem: str = ""
    ca_pem: str = ""
    command_keys: dict[str, str] = {}
    key_endorsements: dict[str, str] = {}
    relays: list[RelayEntry] = []  # the relay directory, so a new agent can fail over from its first relay
    error_code: str = ""
    error_message: str = ""


class ReportPace(_Frame, tag="report_pace"):
    """Master -> relay: how often its agents should report now, and how fast it admits new agent sessions.

    Under overload the Master lowers the report rate (longer intervals) until it keeps up, and raises it again
    once it does (master/pacing.py); the relay passes the intervals on to every agent here as a ``config`` frame,
    and to each agent welcomed later. ``admit_per_s``/``admit_burst`` are a token bucket for new agent sessions on
    this relay (0: unlimited): after a restart, agents come back at a pace the Master can take.
    """

    heartbeat_s: ReportInterval
    telemetry_s: ReportInterval
    factor: float = 1.0  # telemetry_s over the configured interval: 1 when all is well
    admit_per_s: float = 0.0
    admit_burst: int = 0


LinkFrame = (
    AccessHello
    | AccessWelcome
    | Relay
    | AgentConnected
    | AgentDisconnected
    | Revocations
    | AccessStats
    | EnrollRequest
    | EnrollResponse
    | ReportPace
    | DirectoryNews
    | ReportFold
    | Error
)


# --- lanes: read by the relay (access/relay.py, access/upstream.py) and the Master's intake (master/intake.py) ----


class FrameWithoutLane(TypeError):
    """A frame a relay queues for the Master declares no ``lane``: it could wait in the wrong one unnoticed."""


def tag_of(frame: type[_Frame]) -> str:
    tag = frame.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def lanes_of(frames: Iterable[type[_Frame]]) -> dict[str, Lane]:
    """Each frame kind's declared lane, by its type tag; ``FrameWithoutLane`` names a frame that declares none."""
    lanes = {}
    for frame in frames:
        lane = getattr(frame, "lane", None)
        if not isinstance(lane, Lane):
            raise FrameWithoutLane(f"{frame.__name__} ({tag_of(frame)!r}) declares no lane: give it a `lane: ClassVar[Lane]`")
        lanes[tag_of(frame)] = lane
    return lanes


# What a relay queues for the Master: every agent frame (inside a ``relay`` envelope), the relay's notices of
# agents coming and going, and its folds of its agents' reports. The relay's other frames (hello, stats, enrollment)
# go straight onto the link, and the intake takes every link frame that carries no agent frame (or fold) as control.
QUEUED_FRAMES: tuple[type[_Frame], ...] = (*get_args(AgentFrame), AgentConnected, AgentDisconnected, ReportFold)
LANE_OF_KIND: dict[str, Lane] = lanes_of(QUEUED_FRAMES)
TELEMETRY_KINDS = frozenset(kind for kind, lane in LANE_OF_KIND.items() if lane is Lane.TELEMETRY)
ADMISSION_KINDS = frozenset(kind for kind, lane in LANE_OF_KIND.items() if lane is Lane.ADMISSION)
# The agent frames a relay folds into a ``report_fold`` (``AgentReports``) for a Master that takes folds.
FOLDED_KINDS = frozenset({tag_of(Heartbeat), tag_of(Telemetry)})
NEVER_RATE_LIMITED = frozenset(tag_of(frame) for frame in get_args(AgentFrame) if not frame.rate_limited)


# --- codec -----------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_agent_decoder = msgspec.json.Decoder(AgentFrame)
_master_decoder = msgspec.json.Decoder(MasterFrame)
_link_decoder = msgspec.json.Decoder(LinkFrame)
_link_batch_decoder = msgspec.json.Decoder(list[LinkFrame])
_raw_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def encode(frame: msgspec.Struct) -> bytes:
    return _encoder.encode(frame)


def signing_bytes(body: CommandBody) -> bytes:
    """Canonical bytes a command signature covers: sorted keys, so re-encoding cannot change them."""
    return msgspec.json.encode(body, order="sorted")


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes | str, max_bytes: int) -> Any:
    if len(data) > max_bytes:
        raise ProtocolError(
            f"frame of {len(data)} bytes exceeds the {max_bytes}-byte limit",
            code=ErrorCode.FRAME_TOO_LARGE.value,
        )
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.endswith("at `$.type`") and text.startswith("Invalid value"):
            raise ProtocolError(f"unknown frame type: {text}", code=ErrorCode.UNKNOWN_TYPE.value) from None
        raise ProtocolError(f"frame does not match its schema: {text}", code=ErrorCode.SCHEMA_VIOLATION.value) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}", code=ErrorCode.BAD_JSON.value) from None
    # msgspec lets these two through for hostile input (found by tests/access/test_fuzz.py): text that is not
    # UTF-8 (bytes inside a string, or a str holding lone surrogates), and arrays nested thousands deep.
    except UnicodeError as exc:
        raise ProtocolError(f"frame is not valid UTF-8: {exc}", code=ErrorCode.BAD_JSON.value) from None
    except RecursionError:
        raise ProtocolError("frame is nested too deeply", code=ErrorCode.SCHEMA_VIOLATION.value) from None


def decode_agent_frame(data: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> AgentFrame:
    """Decode and validate a frame an agent sent; raises ``ProtocolError`` with a wire error code."""
    frame: AgentFrame = _decode(_agent_decoder, data, max_bytes)
    return frame


def decode_master_frame(data: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> MasterFrame:
    frame: MasterFrame = _decode(_master_decoder, data, max_bytes)
    return frame


def decode_link_frame(data: bytes | str, max_bytes: int = HARD_FRAME_BYTES) -> LinkFrame:
    frame: LinkFrame = _decode(_link_decoder, data, max_bytes)
    return frame


def decode_link_message(data: bytes | str, max_bytes: int = HARD_FRAME_BYTES) -> list[LinkFrame | ProtocolError]:
    """One link message: a frame, or a batch of them (a JSON array), each decoded on its own.

    A bad frame in a batch costs only itself: its place in the list holds its ``ProtocolError``, the others are
    decoded. A message that is neither an object nor an array of them is one error.
    """
    start = data.lstrip()[:1]
    if start not in (b"[", "["):
        try:
            return [decode_link_frame(data, max_bytes)]
        except ProtocolError as exc:
            return [exc]
    try:
        return list(_decode(_link_batch_decoder, data, max_bytes))
    except ProtocolError:
        pass  # one frame (or more) is bad, or the array itself: sort them out one by one
    try:
        parts = _decode(_raw_batch_decoder, data, max_bytes)
    except ProtocolError as exc:
        return [exc]
    decoded: list[LinkFrame | ProtocolError] = []
    for part in parts:
        try:
            decoded.append(decode_link_frame(bytes(part), max_bytes))
        except ProtocolError as exc:
            decoded.append(exc)
    return decoded


def error_frame(exc: ProtocolError, ref: str | None = None) -> bytes:
    return encode(Error(code=exc.code, message=str(exc), ref=ref))


def negotiate(offered: list[int], supported: tuple[int, ...] = PROTOCOL_VERSIONS) -> int:
    """The highest version both sides speak; ``ProtocolError`` when there is none."""
    common = set(offered) & set(supported)
    if not common:
        raise ProtocolError(
            f"no common protocol version: peer offers {sorted(offered)}, this side speaks {list(supported)}",
            code=ErrorCode.UNSUPPORTED_VERSION.value,
        )
    return max(common)
