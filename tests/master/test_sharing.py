"""What many hosts report alike is kept once by the Master (master/sharing.py), and still reads as each host said it."""

from __future__ import annotations

from pathlib import Path

from common.catalog import CATALOG, reference_gpu_info
from common.inventory import GpuInfo, HostInfo, NvLink
from common.wire import decode_agent_frame, encode
from master.config import MasterConfig
from master.master import Master
from master.sharing import SharedValues
from tests.master.linked import HOST, connect, hello, relay_link


def decoded_gpus(agent: str, count: int = 8) -> list[GpuInfo]:
    """An H100 SXM host's cards as the Master decodes its hello: every value a new object."""
    cards = [
        reference_gpu_info(CATALOG["h100-sxm"], index=i, uuid=f"GPU-{agent}-{i}", pci_bus_id=f"0000:{i:02x}:00.0")
        for i in range(count)
    ]
    frame = decode_agent_frame(encode(hello(cards)))
    return frame.inventory.gpus  # type: ignore[union-attr]


def test_a_shared_gpu_info_equals_what_the_host_said_and_shares_its_peers_values() -> None:
    shared = SharedValues()
    a, b = decoded_gpus("a"), decoded_gpus("b")
    kept_a, kept_b = [shared.gpu_info(g) for g in a], [shared.gpu_info(g) for g in b]

    assert kept_a == a and kept_b == b
    assert len(a[0].nvlinks) == 18 and a[0].nvlinks is not b[0].nvlinks  # as decoded: one tuple per card
    assert kept_a[0].nvlinks is kept_b[0].nvlinks is kept_a[1].nvlinks
    assert kept_a[0].name is kept_b[0].name and kept_a[0].pci_bus_id is kept_b[0].pci_bus_id
    assert kept_a[0].memory_total_mib is kept_b[0].memory_total_mib
    assert kept_a[0].uuid is a[0].uuid  # a card's own


def test_a_value_is_shared_only_with_a_value_of_its_own_type() -> None:
    shared = SharedValues()
    assert shared.one(700) == 700
    power = shared.one(700.0)
    assert type(power) is float and type(shared.one(700)) is int and shared.one(True) is True


def test_the_pool_is_bounded_and_a_value_past_the_bound_is_kept_as_given() -> None:
    shared = SharedValues(limit=2)
    first, second = shared.one("x" * 40), shared.one("y" * 40)
    made_up = "z" * 40
    assert shared.one(made_up) is made_up and len(shared) == 2
    assert shared.one("x" * 40) is first and shared.one("y" * 40) is second
    assert shared.one("".join(["z"] * 40)) is not made_up  # not pooled: each is kept as given


def test_a_shared_host_equals_what_the_host_said() -> None:
    shared = SharedValues()
    other = HostInfo(**{**{f: getattr(HOST, f) for f in HOST.__struct_fields__}, "hostname": "gpu-host-2"})
    a, b = shared.host(HOST), shared.host(other)
    assert a == HOST and b == other and a is not None and b is not None
    assert a.cpu_model is b.cpu_model and a.hostname != b.hostname
    assert shared.host(None) is None


async def test_the_registry_keeps_one_nvlink_layout_for_every_card_of_the_fleet(tmp_path: Path) -> None:
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        link = relay_link()
        for agent in ("agt-a", "agt-b"):
            await connect(master, link, agent, decoded_gpus(agent, 2))
        a, b = master.registry.gpus_of("agt-a"), master.registry.gpus_of("agt-b")
        assert [g.info for g in a] == decoded_gpus("agt-a", 2)
        assert a[0].info.nvlinks is b[1].info.nvlinks and a[0].info.nvlinks[0] == NvLink(link=0, active=True)
        assert a[0].info.name is b[0].info.name
    finally:
        await master.stop()
