"""The output collector (management/services/outputs.py) on a real Master (SQLite in tmp_path) whose host talks through the
Master's relay-link handlers (tests/master/linked.py): a workload fails, its container's delete is reported done, and
the collector reads, stores and settles its output. Reading through a real relay and agent is
tests/e2e/test_workload_output.py's; here ``read`` gives what such a read would return or raise."""

from __future__ import annotations

import time

from common.wire import CommandResult, Heartbeat
from management.client.tunnel import TunnelClosed
from management.services.outputs import OutputCollector, OutputSettings
from management.store import output_repo
from management.workloads.runner import SchedulerLoop
from master.link import AccessLink
from master.master import Master
from master.records import KeptOutput
from master.tunnels import TunnelUnavailable
from tests.management.workloads.test_runner import deletes_sent, host, scheduler, spec, started
from tests.master.linked import relay

OUTPUT = b"".join(b"step %d\n" % i for i in range(1, 13)) + b"Traceback: KeyError: 'lr'\n"


class HostAnswers:
    """What reading the container's output from its host gives, in turn: bytes, or an error to raise."""

    def __init__(self, *answers: bytes | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, kept: KeptOutput) -> bytes:
        self.asked.append(kept.container)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def failed_workload(master: Master, link: AccessLink, loop: SchedulerLoop, *, delete_result: dict) -> str:
    """A workload whose container exited 3 and whose delete the host reports with ``delete_result``."""
    await host(master, link, "agt-a")
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    await started(master, link, await loop.book.get(wl.id))
    await loop.cycle()
    (a,) = (await loop.book.get(wl.id)).assignments
    await relay(master, link, "agt-a", Heartbeat(seq=1, ts=time.time(), running=[], exited={a.container: 3}))
    await loop.cycle()
    assert (await loop.book.get(wl.id)).state == "failed"
    (delete,) = deletes_sent(link, "agt-a")
    await relay(master, link, "agt-a", CommandResult(id=delete.body.id, ok=True, result=delete_result))
    await relay(master, link, "agt-a", Heartbeat(seq=2, ts=time.time(), running=[], exited={}))
    return wl.id


KEPT_BY_HOST = {"container": {"name": "x", "exit_code": 3}, "output": {"bytes": 98, "kept": 98, "truncated": False}}


async def test_a_failed_workloads_output_is_read_kept_and_its_reason_gets_the_last_lines(master, link):
    loop = scheduler(master)
    workload_id = await failed_workload(master, link, loop, delete_result=KEPT_BY_HOST)
    answers = HostAnswers(OUTPUT)
    collector = OutputCollector(master, loop.book, output_repo(master.store), answers)  # the default: 3 lines

    await collector.step()

    (kept,) = await output_repo(master.store).list(workload_id=workload_id)
    assert (kept.state, kept.data, kept.exit_code, kept.truncated) == ("kept", OUTPUT, 3, False)
    rec = await loop.book.get(workload_id)
    assert [a.state for a in rec.assignments] == ["deleted"]
    assert (
        rec.state_reason
        == "a container exited with code 3\nlast lines of replica 0:\nstep 11\nstep 12\nTraceback: KeyError: 'lr'"
    )
    await collector.step()
    assert len(answers.asked) == 1  # read once


async def test_a_host_that_kept_nothing_makes_it_lost_and_a_broken_read_is_tried_again(master, link):
    loop = scheduler(master)
    workload_id = await failed_workload(master, link, loop, delete_result=KEPT_BY_HOST)
    answers = HostAnswers(
        TunnelUnavailable("host agt-a is not connected to any relay now"),  # no try spent on a host that is away
        TunnelClosed("the tunnel closed (1011): the agent's side failed"),
        TunnelClosed("container x of workload y does not run on this host"),
    )
    collector = OutputCollector(master, loop.book, output_repo(master.store), answers, OutputSettings(max_tries=3))

    await collector.step()
    assert [(k.state, k.tries) for k in await output_repo(master.store).list(workload_id=workload_id)] == [("pending", 0)]
    await collector.step()
    assert [(k.state, k.tries) for k in await output_repo(master.store).list(workload_id=workload_id)] == [("pending", 1)]
    await collector.step()

    (lost,) = await output_repo(master.store).list(workload_id=workload_id)
    assert (lost.state, lost.reason) == ("lost", "host agt-a kept none of its output")
    rec = await loop.book.get(workload_id)
    assert [a.state for a in rec.assignments] == ["deleted"] and rec.state_reason == "a container exited with code 3"


async def test_a_container_that_was_not_there_to_delete_is_settled_without_a_read(master, link):
    loop = scheduler(master)
    workload_id = await failed_workload(master, link, loop, delete_result={"container": None})
    answers = HostAnswers()
    collector = OutputCollector(master, loop.book, output_repo(master.store), answers)

    await collector.step()

    (lost,) = await output_repo(master.store).list(workload_id=workload_id)
    assert lost.state == "lost" and answers.asked == []
    assert [a.state for a in (await loop.book.get(workload_id)).assignments] == ["deleted"]


async def test_retention_deletes_kept_output_once_it_is_old_enough(master, link):
    loop = scheduler(master)
    workload_id = await failed_workload(master, link, loop, delete_result=KEPT_BY_HOST)
    now = [time.time()]
    collector = OutputCollector(
        master, loop.book, output_repo(master.store), HostAnswers(OUTPUT), OutputSettings(retention_s=60.0), clock=lambda: now[0]
    )
    await collector.step()
    assert await output_repo(master.store).list(workload_id=workload_id)

    now[0] += 61.0
    await collector.step()

    assert await output_repo(master.store).list(workload_id=workload_id) == []
