"""What a failed command may tell the renter (agent/redact.py): the engine's words without the container's secrets or
this host's directories. Pure functions, then the executor with the real process runtime."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.config import AgentConfig
from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.redact import HIDDEN, redact, secrets_of
from agent.runtime.process import ProcessRuntime
from common.containers import ContainerSpec, RegistryAuth
from common.pki import CommandVerifier
from common.storage import ContainerStorage, StorageCredentials
from tests.agent.test_executor import AGENT, command, signer  # noqa: F401  (the signer fixture)


def test_every_secret_of_a_create_spec_is_known_env_registry_password_and_storage_keys():
    spec = ContainerSpec(
        name="train",
        image="registry.example/team/app:1",
        env={"HF_TOKEN": "hf_abcdef123456", "MODE": "fast"},
        registry_auth=RegistryAuth(username="team", password="registry-pass-9"),
        storage=ContainerStorage(credentials=StorageCredentials(access_key_id="AKIAEXAMPLE", secret_access_key="wJalrXUtnFEMI")),
    )
    assert set(secrets_of(spec)) >= {"hf_abcdef123456", "fast", "registry-pass-9", "AKIAEXAMPLE", "wJalrXUtnFEMI"}


def test_the_engines_words_keep_their_sense_without_secrets_or_host_paths():
    words = (
        "pull access denied for registry.example/team/app, token registry-pass-9 refused; "
        "mount /srv/idlegrid/agent-data/wl-1/in: no such file"
    )
    paths = {"/srv/idlegrid/agent": "<agent state>", "/srv/idlegrid/agent-data": "<agent data>"}
    assert redact(words, ["registry-pass-9"], paths) == (
        f"pull access denied for registry.example/team/app, token {HIDDEN} refused; mount <agent data>/wl-1/in: no such file"
    )


def test_short_values_are_not_taken_out_of_ordinary_words():
    assert redact("exit status 1: permission denied", ["1", "on"], {}) == "exit status 1: permission denied"


secret = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=4, max_size=12).filter(lambda s: s not in HIDDEN)


@given(st.lists(secret, max_size=4), st.lists(st.text(max_size=20), max_size=4))
def test_no_secret_survives_redaction(secrets, filler):
    """Property: whatever surrounds them, however they overlap, no secret of the spec is left in the words."""
    text = "".join(f"{f}{s}" for f, s in zip(filler + [""] * len(secrets), secrets, strict=False)) + "".join(filler)
    out = redact(text, secrets, {})
    assert not any(s in out for s in secrets), (text, out)


async def test_a_failed_create_answers_without_the_renters_secret_or_this_hosts_work_directory(tmp_path, signer):  # noqa: F811
    work = tmp_path / "work"
    runtime = ProcessRuntime(state_dir=tmp_path / "state", work_root=work)
    verifier = CommandVerifier({signer.key_id: signer.public_key_b64()})
    ledger = CommandLog(tmp_path / "state" / "commands.db")
    paths = {str(tmp_path / "state"): "<agent state>", str(work): "<agent work>"}
    executor = CommandExecutor(AGENT, ledger, runtime, verifier, private_paths=paths)
    token = "hf_live_0123456789abcdef"
    spec = {"name": "train", "image": "none", "command": [f"{work}/train/{token}.sh"], "env": {"HF_TOKEN": token}}

    result = await executor.execute(command(signer, spec=spec))

    assert not result.ok and result.error_code == "bad_command"
    assert result.error is not None and token not in result.error and str(tmp_path) not in result.error
    assert f"'<agent work>/train/{HIDDEN}.sh' of container 'train' is not an executable" in result.error, result.error
    entry = ledger.get("cmd-1")
    assert entry is not None and entry.error == result.error  # the command record holds no secret either


def test_an_agents_private_paths_are_its_state_data_and_work_directories(tmp_path):
    config = AgentConfig(state_dir=str(tmp_path / "agent"))
    paths = config.private_paths()
    assert paths[str(tmp_path / "agent")] == "<agent state>"
    assert paths[str(tmp_path / "agent-data")] == "<agent data>"
    assert paths[str(tmp_path / "agent-work")] == "<agent work>"
    words = f"mkdir {tmp_path}/agent-data/wl-1: permission denied"
    assert redact(words, [], paths) == "mkdir <agent data>/wl-1: permission denied"
