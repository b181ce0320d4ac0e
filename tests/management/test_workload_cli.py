"""``idlegrid workload``, run in-process against the real API of a real Master (SQLite) with a renter's key file:
what a renter types and what it reads back. The blocking CLI runs in a thread beside the server's event loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from management import cli
from tests.management.hosts import api_key


@pytest.fixture
async def renter(api, tmp_path: Path):
    """``run(*args)`` runs ``idlegrid workload ARGS`` as renter alice; returns (exit status, stdout, stderr)."""
    key_file = tmp_path / "alice.key"
    key_file.write_text((await api_key(api.master, "renter", "alice"))["Authorization"].removeprefix("Bearer "))
    url = str(api.make_url("")).rstrip("/")

    async def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        argv = ["workload", *args[:1], "--api", url, "--key-file", str(key_file), *args[1:]]
        code = await asyncio.to_thread(cli.main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_a_renter_submits_lists_shows_and_cancels_a_workload(renter, capsys):
    code, out, err = await renter(
        "submit", "--name", "train", "--image", "ghcr.io/acme/train:1", "--gpus", "2", "--model", "h100-sxm",
        "--env", "HF_TOKEN=hf_secret", "--port", "8080", "--", "python", "train.py", "--epochs", "3", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("submitted wl-") and out.rstrip().endswith("for account alice: queued")
    workload_id = out.split()[1]

    code, out, _ = await renter("list", capsys=capsys)
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "ACCOUNT", "STATE", "REPLICAS", "GPUS", "PRIORITY", "CREATED", "REASON"]
    assert row.split()[:7] == [workload_id, "train", "alice", "queued", "1", "2", "normal"]

    code, out, _ = await renter("get", workload_id, capsys=capsys)
    assert "command:     python train.py --epochs 3" in out
    assert "env:         HF_TOKEN  (values are never shown)" in out and "hf_secret" not in out
    assert "replicas:    1 x 2 GPU (h100-sxm)" in out

    code, out, _ = await renter("cancel", workload_id, capsys=capsys)
    assert (code, out.strip()) == (0, f"{workload_id} (train): cancelled (cancelled by its owner)")
    code, out, _ = await renter("list", "--state", "queued", capsys=capsys)
    assert out.strip() == "no workloads"
    code, out, _ = await renter("get", workload_id, "--json", capsys=capsys)
    assert json.loads(out)["state"] == "cancelled"


async def test_a_spec_file_gives_every_field_and_flags_override_it(renter, capsys, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(
        'name = "sweep"\nimage = "busybox"\nreplicas = 3\npriority = "high"\n'
        '[replica]\ngpus = 1\nmin_vram_mib = 24000\n[constraints]\nregions = ["eu-west"]\nmin_reputation = 0.8\n'
    )
    code, out, err = await renter("submit", "-f", str(spec), "--replicas", "2", "--json", capsys=capsys)
    assert code == 0, err
    body = json.loads(out)
    assert (body["spec"]["replicas"], body["spec"]["priority"]) == (2, "high")
    assert body["spec"]["replica"]["min_vram_mib"] == 24000
    assert body["spec"]["constraints"] == body["spec"]["constraints"] | {"regions": ["eu-west"], "min_reputation": 0.8}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--name", "x", "--image", "busybox", "--gpus", "0"], "replica.gpus"),  # checked before sending
        (["--name", "x", "--image", "busybox", "--model", "h900"], "replica.models: unknown GPU model 'h900'"),  # by the API
        (["--name", "x", "--image", "busybox", "--priority", "urgent"], "priority: unknown priority class 'urgent'"),
        (["--name", "x", "--image", "busybox", "--env", "NOEQUALS"], "KEY=VALUE"),
        (["--image", "busybox"], "name: give --name"),
        (["--name", "x", "--image", "busybox", "--max-duration-s", "nan"], "max_duration_s"),
    ],
)
async def test_a_bad_spec_is_named_in_one_line_without_a_traceback(renter, capsys, args, said):
    code, out, err = await renter("submit", *args, capsys=capsys)
    assert code == 2 and out == ""
    assert said in err and "Traceback" not in err
    assert err.startswith("idlegrid workload submit: ")


async def test_another_accounts_workload_is_not_found(renter, capsys, api):
    theirs = await api.operator.submit_workload({"name": "secret-job", "image": "busybox"}, account="bob")
    code, _, err = await renter("cancel", theirs["id"], capsys=capsys)
    assert code == 2 and f"404 not_found: no workload '{theirs['id']}'" in err
