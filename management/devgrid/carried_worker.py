"""An endpoint worker for a process-runtime host, carried whole in its own spec: the handler library (as
``idlegrid_worker``) and the echo worker (echo_worker.py) in a zip, base64 in one environment variable, and a command
that writes it to the worker's working directory and runs it with the host's Python.

A process-runtime host runs a workload's command on the host itself, in a sandbox of its own (its own /tmp, its own
unprivileged uid): it sees no checkout of idlegrid and no image. Carrying the code in the spec is how the demo's
endpoint (demo.py) gets a real worker there without a registry or a package installed on the host. A renter's
endpoint on such a host carries its own code the same way, or uses an image on a container host.
"""

from __future__ import annotations

import base64
import io
import zipfile
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"  # the host's (Debian's python3): a sandboxed uid cannot run a virtualenv's under /root
CODE_ENV = "IDLEGRID_WORKER_CODE"
LIBRARY = Path(__file__).resolve().parents[2] / "common" / "endpoint_worker"
ZIP_NAME = "idlegrid-worker.zip"  # written to the worker's working directory (and in its command line)


def carrying(program: str) -> str:
    """A ``python -c`` program that unpacks the zip the environment carries (``CODE_ENV``), puts it on ``sys.path``,
    then runs ``program``."""
    return (
        f"import base64, os, sys; path = os.path.join(os.getcwd(), '{ZIP_NAME}'); "
        f"open(path, 'wb').write(base64.b64decode(os.environ['{CODE_ENV}'])); sys.path.insert(0, path); {program}"
    )


BOOTSTRAP = carrying("import runpy; runpy.run_module('echo_worker', run_name='__main__')")


def worker_zip(*, echo_worker: bool = True) -> str:
    """The library as the package ``idlegrid_worker`` (and the echo worker as ``echo_worker``), zipped, base64."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(LIBRARY.glob("*.py")):
            archive.write(source, f"idlegrid_worker/{source.name}")
        if echo_worker:
            archive.write(Path(__file__).parent / "echo_worker.py", "echo_worker.py")
    return base64.b64encode(packed.getvalue()).decode()


def carried_worker() -> tuple[list[str], dict[str, str]]:
    """The command and the environment of an echo worker that carries its code (an endpoint spec's ``command`` and
    ``env``)."""
    return [SYSTEM_PYTHON, "-c", BOOTSTRAP], {CODE_ENV: worker_zip()}
