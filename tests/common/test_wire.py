"""Wire protocol v1: typed frames, one codec, clear error codes for every kind of bad input."""

import gc
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.catalog import CATALOG, reference_gpu_info
from common.errors import ProtocolError
from common.inventory import (
    MAX_MIG_INSTANCES,
    MAX_REGISTRY_PATTERNS,
    GpuInfo,
    GpuSample,
    HostInfo,
    ImageSource,
    Inventory,
    MigInstance,
)
from common.wire import (
    MAX_FRAME_BYTES,
    MAX_WORKER_IN_FLIGHT,
    MAX_WORKER_TAKE_WAIT_S,
    PROTOCOL_VERSIONS,
    AgentEvent,
    AgentEventKind,
    CommandBody,
    Heartbeat,
    Hello,
    Relay,
    Telemetry,
    WorkerAnswer,
    WorkerCall,
    WorkerOp,
    decode_agent_frame,
    decode_link_frame,
    decode_link_message,
    decode_master_frame,
    encode,
    negotiate,
    signing_bytes,
)

HOST = HostInfo(
    hostname="h", cpu_model="cpu", cpu_cores=8, ram_mib=1024, disk_total_gib=10, disk_free_gib=5, os="Debian", kernel="6.1"
)


def test_hello_round_trips_with_its_inventory():
    gpu = GpuInfo(
        index=0, uuid="GPU-1", name="NVIDIA L4", pci_bus_id="0000:01:00.0", memory_total_mib=23034, compute_capability="8.9"
    )
    hello = Hello(versions=[1], agent_version="0.1", inventory=Inventory(host=HOST, gpus=[gpu]))
    assert decode_agent_frame(encode(hello)) == hello


def test_a_hello_says_where_the_hosts_engine_gets_images_and_an_older_agents_hello_without_it_still_decodes():
    source = ImageSource(pull=False, registries_allowed=["localhost"], registries_denied=["docker.io"])
    hello = Hello(versions=[1], agent_version="0.2", inventory=Inventory(host=HOST, image_source=source))
    decoded = decode_agent_frame(encode(hello))
    assert isinstance(decoded, Hello) and decoded.inventory.image_source == source
    older = msgspec.json.encode({"type": "hello", "versions": [1], "agent_version": "0.1", "inventory": {"host": HOST}})
    decoded = decode_agent_frame(older)
    assert isinstance(decoded, Hello) and decoded.inventory.image_source is None  # unknown: gets anything


def test_a_host_allowing_more_registries_than_a_hello_carries_reports_no_source_rather_than_a_narrower_one():
    allowed = [f"registry-{i}.example" for i in range(MAX_REGISTRY_PATTERNS + 1)]
    assert ImageSource.of_settings(True, allowed, []) is None
    kept = ImageSource.of_settings(True, [], allowed)  # denied ones past the bound are left out: it refuses less
    assert kept is not None and len(kept.registries_denied) == MAX_REGISTRY_PATTERNS


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"{not json", "bad_json"),
        (b'{"type": "teleport"}', "unknown_type"),
        (b'{"type": "heartbeat", "seq": "one", "ts": 1}', "schema_violation"),
        (b'{"seq": 1, "ts": 1}', "schema_violation"),
        (b"[1, 2]", "schema_violation"),
        (b'{"type": "heartbeat", "seq": 1, "ts": 1, "pad": "' + b"x" * MAX_FRAME_BYTES + b'"}', "frame_too_large"),
    ],
)
def test_bad_input_raises_a_protocol_error_with_its_code(data, code):
    with pytest.raises(ProtocolError) as info:
        decode_agent_frame(data)
    assert info.value.code == code


def test_agent_frames_cannot_pose_as_master_frames():
    with pytest.raises(ProtocolError) as info:
        decode_master_frame(encode(Heartbeat(seq=1, ts=1.0)))
    assert info.value.code == "unknown_type"


def test_relay_envelope_carries_the_agent_frame_untouched():
    inner = encode(Heartbeat(seq=7, ts=3.5))
    envelope = decode_link_frame(encode(Relay(agent_id="agt-1", frame=msgspec.Raw(inner))))
    assert isinstance(envelope, Relay)
    assert envelope.agent_id == "agt-1"
    assert bytes(envelope.frame) == inner


def test_signing_bytes_do_not_depend_on_key_order():
    a = CommandBody(id="c", agent_id="a", kind="k", spec={"x": 1, "y": 2}, issued_at=1.0, deadline=2.0, key_id="k1")
    b = CommandBody(id="c", agent_id="a", kind="k", spec={"y": 2, "x": 1}, issued_at=1.0, deadline=2.0, key_id="k1")
    assert signing_bytes(a) == signing_bytes(b)
    decoded = msgspec.json.decode(msgspec.json.encode(a), type=CommandBody)
    assert signing_bytes(decoded) == signing_bytes(a)


def test_version_negotiation_picks_the_highest_common_version_or_refuses():
    assert negotiate([1, 2, 3], (1, 2)) == 2
    with pytest.raises(ProtocolError) as info:
        negotiate([7])
    assert info.value.code == "unsupported_version"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_no_byte_string_makes_a_decoder_raise_anything_but_protocol_error(data):
    for decode in (decode_agent_frame, decode_master_frame, decode_link_frame):
        try:
            decode(data)
        except ProtocolError:
            pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["hello", "heartbeat", "telemetry", "command_ack", "command_result", "event", "error", "relay", "x"]),
    st.dictionaries(
        st.sampled_from(["seq", "ts", "id", "ok", "samples", "inventory", "versions", "agent_id", "frame", "code"]), json_values
    ),
)
def test_well_formed_json_with_wrong_shapes_only_raises_protocol_error(frame_type, fields):
    data = msgspec.json.encode({"type": frame_type, **fields})
    for decode in (decode_agent_frame, decode_master_frame, decode_link_frame):
        try:
            decode(data)
        except ProtocolError as exc:
            assert exc.code in {"schema_violation", "unknown_type"}


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_a_non_finite_number_in_a_frame_is_refused_as_bad_input(number):
    frame = f'{{"type":"heartbeat","seq":1,"ts":{number}}}'
    with pytest.raises(ProtocolError) as refused:
        decode_agent_frame(frame.encode())
    assert refused.value.code in ("bad_json", "schema_violation")


def test_an_agent_event_outside_the_closed_set_is_refused():
    with pytest.raises(ProtocolError, match="kind") as refused:
        decode_agent_frame(b'{"type":"event","kind":"transition","ts":1.0}')
    assert refused.value.code == "schema_violation"
    report = decode_agent_frame(b'{"type":"event","kind":"gpu_xid","ts":1.0,"gpu_uuid":"GPU-1","code":79}')
    assert report == AgentEvent(kind=AgentEventKind.GPU_XID, ts=1.0, gpu_uuid="GPU-1", code=79)


def test_an_agent_event_message_is_bounded():
    too_long = "x" * 513
    with pytest.raises(ProtocolError, match="length"):
        decode_agent_frame(f'{{"type":"event","kind":"runtime_failure","ts":1.0,"message":"{too_long}"}}'.encode())


def test_an_inventory_with_more_gpus_than_the_wire_allows_is_refused():
    gpu = {"index": 0, "uuid": "GPU-x", "name": "n", "pci_bus_id": "0", "memory_total_mib": 1, "compute_capability": "9.0"}
    host = {
        "hostname": "h",
        "cpu_model": "c",
        "cpu_cores": 1,
        "ram_mib": 1,
        "disk_total_gib": 1,
        "disk_free_gib": 1,
        "os": "o",
        "kernel": "k",
    }
    hello = {"type": "hello", "versions": [1], "agent_version": "1", "inventory": {"host": host, "gpus": [gpu] * 65}}
    with pytest.raises(ProtocolError, match="length"):
        decode_agent_frame(msgspec.json.encode(hello))


# --- link batches ---------------------------------------------------------------------------------------------


def test_a_link_message_is_one_frame_or_an_array_of_them_in_order():
    frames = [Relay(agent_id=f"agt-{n}", frame=msgspec.Raw(b'{"type":"heartbeat","seq":%d,"ts":1.0}' % n)) for n in range(3)]
    assert decode_link_message(encode(frames[0])) == [frames[0]]
    batch = b"[" + b",".join(encode(f) for f in frames) + b"]"
    assert decode_link_message(batch) == frames
    assert decode_link_message(batch.decode()) == frames  # text as well as bytes


def test_a_bad_frame_in_a_batch_costs_only_itself():
    good = [encode(Relay(agent_id=f"agt-{n}", frame=msgspec.Raw(b'{"type":"heartbeat","seq":1,"ts":1.0}'))) for n in range(2)]
    batch = b"[" + good[0] + b',{"type":"no_such_frame"},' + good[1] + b"]"
    first, bad, last = decode_link_message(batch)
    assert isinstance(first, Relay) and first.agent_id == "agt-0"
    assert isinstance(bad, ProtocolError) and bad.code == "unknown_type"
    assert isinstance(last, Relay) and last.agent_id == "agt-1"


@pytest.mark.parametrize("data", [b"[", b"[1,", b"{", b"", b"[{}]x"])
def test_a_broken_link_message_is_one_protocol_error(data):
    [error] = decode_link_message(data)
    assert isinstance(error, ProtocolError)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1024))
def test_no_byte_string_makes_the_link_message_decoder_raise(data):
    assert all(isinstance(part, (ProtocolError, msgspec.Struct)) for part in decode_link_message(b"[" + data))


# --- MIG in the inventory -------------------------------------------------------------------------------------


def test_a_partitioned_gpu_round_trips_with_its_mig_instances():
    instances = [
        MigInstance(uuid=f"MIG-{i}", profile="1g.10gb", memory_mib=9984, gpu_instance_id=7 + i, compute_instance_id=0, index=i)
        for i in range(7)
    ]
    gpu = GpuInfo(
        index=0,
        uuid="GPU-1",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="0000:01:00.0",
        memory_total_mib=81559,
        compute_capability="9.0",
        mig_enabled=True,
        mig_instances=tuple(instances),
    )
    hello = Hello(versions=[1], agent_version="0.1", inventory=Inventory(host=HOST, gpus=[gpu]))
    assert decode_agent_frame(encode(hello)) == hello


def test_an_inventory_from_an_agent_that_knows_no_mig_reads_as_mig_off():
    old = {"index": 0, "uuid": "GPU-x", "name": "n", "pci_bus_id": "0", "memory_total_mib": 1, "compute_capability": "9.0"}
    gpu = msgspec.json.decode(msgspec.json.encode(old), type=GpuInfo)
    assert (gpu.mig_enabled, gpu.mig_instances) == (False, ())


def test_a_gpu_claiming_more_mig_instances_than_the_wire_allows_is_refused():
    mig = {"uuid": "MIG-x", "profile": "1g.10gb", "memory_mib": 1}
    gpu = {"index": 0, "uuid": "GPU-x", "name": "n", "pci_bus_id": "0", "memory_total_mib": 1, "compute_capability": "9.0"}
    gpu |= {"mig_enabled": True, "mig_instances": [mig] * (MAX_MIG_INSTANCES + 1)}
    host = msgspec.to_builtins(HOST)
    hello = {"type": "hello", "versions": [1], "agent_version": "1", "inventory": {"host": host, "gpus": [gpu]}}
    with pytest.raises(ProtocolError, match="length"):
        decode_agent_frame(msgspec.json.encode(hello))


def test_a_worker_call_round_trips_and_its_bounds_are_refused_at_decode():
    call = WorkerCall(call_id="c-1", container="w-c", endpoint_id="ep-a", worker_id="w-1", op=WorkerOp.TAKE, wait_s=20.0)
    assert decode_agent_frame(encode(call)) == call
    fields = {"type": "worker_call", "call_id": "c", "container": "w", "endpoint_id": "e", "worker_id": "w"}
    for bad in (
        {"op": "take", "wait_s": MAX_WORKER_TAKE_WAIT_S + 1},
        {"op": "heartbeat", "in_flight": ["r"] * (MAX_WORKER_IN_FLIGHT + 1)},
        {"op": "partial", "seq": -1},
        {"op": "launch"},
        {"op": "result", "request_id": "r" * 129},
    ):
        with pytest.raises(ProtocolError, match="schema"):
            decode_agent_frame(json.dumps({**fields, **bad}))


def test_a_worker_answer_carries_an_http_status_and_any_json_body():
    answer = WorkerAnswer(call_id="c-1", status=200, body={"id": "r1", "input": [1, {"a": None}], "attempt": 1})
    assert decode_master_frame(encode(answer)) == answer
    with pytest.raises(ProtocolError, match="schema"):
        decode_master_frame(b'{"type": "worker_answer", "call_id": "c", "status": 600}')


def test_gpu_and_host_descriptions_and_samples_as_decoded_are_out_of_the_collectors_sight():
    """The Master keeps one description and one latest sample per GPU of the fleet: each tracked by the garbage
    collector would cost 16 bytes and a visit in every full collection (common/inventory.py)."""
    inventory = Inventory(host=HOST, gpus=[reference_gpu_info(CATALOG["h100-sxm"], uuid="GPU-a", pci_bus_id="0000:01:00.0")])
    hello = decode_agent_frame(encode(Hello(versions=list(PROTOCOL_VERSIONS), agent_version="t", inventory=inventory)))
    assert isinstance(hello, Hello)
    card = hello.inventory.gpus[0]
    assert card == inventory.gpus[0] and len(card.nvlinks) == 18
    assert not any(gc.is_tracked(o) for o in (card, card.nvlinks[0], hello.inventory.host))
    telemetry = decode_agent_frame(
        encode(Telemetry(ts=1.0, samples=[GpuSample(uuid=card.uuid, ts=1.0, throttle_reasons=("gpu_idle",))]))
    )
    assert isinstance(telemetry, Telemetry) and not gc.is_tracked(telemetry.samples[0])
