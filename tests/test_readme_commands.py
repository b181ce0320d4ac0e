"""The README's shell sessions and the demo banner's command lines, extracted as a reader reads them
(tests/support/readme.py; tests/e2e/test_readme.py runs them against a demo)."""

from __future__ import annotations

from tests.support.grid import REPO
from tests.support.readme import Session, banner_lines, sessions

SAMPLE = """# Title

### Try it

```
$ idlegrid workload submit --name hello -- \\
    sleep 300
submitted wl-31288226e14ee2e1 (hello) for account demo-renter: queued
$ idlegrid offers search 'num_gpus>=1'
OFFER                 MODEL      GPUS
agt-0b81665645f74f27  l40s       4/4
agt-37256651e53a48c6  h100-sxm   8/8
$ idlegrid rent agt-0b81665645f74f27 --gpus 2
rented agt-0b81665645f74f27: workload wl-ff7cdc77d59aa2b4 (rent) is queued
```

```sh
scripts/demo    # not a session: no prompt
```
"""


def test_a_session_is_its_prompted_lines_with_continuations_joined_and_their_samples() -> None:
    [block] = sessions(SAMPLE)
    assert [s.command for s in block] == [
        "idlegrid workload submit --name hello -- \\\n    sleep 300",
        "idlegrid offers search 'num_gpus>=1'",
        "idlegrid rent agt-0b81665645f74f27 --gpus 2",
    ]
    assert block[0].sample == ("submitted wl-31288226e14ee2e1 (hello) for account demo-renter: queued",)
    assert all(s.heading == "### Try it" for s in block)


def test_a_reader_writes_in_the_ids_their_own_commands_printed() -> None:
    submit, search, rent = sessions(SAMPLE)[0]
    session = Session()
    session.learn(submit.sample, "submitted wl-00000000000000aa (hello) for account demo-renter: queued\n")
    table = "OFFER                 MODEL      GPUS\nagt-11111111111111bb  h100-sxm   8/8\nagt-22222222222222cc  l40s  4/4\n"
    session.learn(search.sample, table)
    assert session.ids == {
        "wl-31288226e14ee2e1": "wl-00000000000000aa",
        "agt-0b81665645f74f27": "agt-22222222222222cc",  # the row of the same model, not the same position
        "agt-37256651e53a48c6": "agt-11111111111111bb",
    }
    assert session.typed(rent.command) == "idlegrid rent agt-22222222222222cc --gpus 2"
    # The words before an id name ids already learned: they are read as the reader's own.
    session.learn(rent.sample, "rented agt-22222222222222cc: workload wl-33333333333333dd (rent) is queued\n")
    assert session.ids["wl-ff7cdc77d59aa2b4"] == "wl-33333333333333dd"


def test_an_id_printed_nowhere_is_not_guessed() -> None:
    submit = sessions(SAMPLE)[0][0]
    session = Session()
    session.learn(submit.sample, "idlegrid: no GPU fits\n")
    assert session.ids == {}


def test_the_banner_lines_are_its_renter_commands_by_label() -> None:
    banner = """idlegrid demo is up
  API:             http://127.0.0.1:7000/api/v1/agents

  Rent a GPU as demo-renter, from another shell:
    export IDLEGRID_API=http://127.0.0.1:7000
    search:        idlegrid offers search 'num_gpus>=1'
    reach a port:  idlegrid workload port-forward ID 8888   # a port it declared
    The demo's hosts run a workload's command as a sandboxed process.

  Console:         http://127.0.0.1:7000/console/
"""
    assert banner_lines(banner) == {
        "export": "export IDLEGRID_API=http://127.0.0.1:7000",
        "search": "idlegrid offers search 'num_gpus>=1'",
        "reach a port": "idlegrid workload port-forward ID 8888   # a port it declared",
    }


def test_the_readme_has_sessions_to_run() -> None:
    steps = [s for block in sessions((REPO / "README.md").read_text()) for s in block]
    assert any("workload submit" in s.command for s in steps) and any(s.command.startswith("ssh ") for s in steps)
