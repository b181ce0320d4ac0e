"""Fixtures shared across the suite. The Podman service is session-scoped and started only by tests that ask.
No test process asks the system's DNS (tests/support/no_dns.py)."""

from tests.support import no_dns
from tests.support.egress import listener  # noqa: F401
from tests.support.localstripe import localstripe  # noqa: F401
from tests.support.operator_api import api  # noqa: F401
from tests.support.podman import podman  # noqa: F401
from tests.support.s3 import s3  # noqa: F401
from tests.support.singletons import pytest_runtest_call  # noqa: F401

no_dns.guard()

# The files whose tests take longest all in (the images' build, the bench smokes, the demo's runs: `--durations` of
# scripts/test's parallel part), collected first. Under `--dist loadfile` the workers take files in the order
# collected, so these start at once and the rest run beside them; collected last, the images' build (8-10 minutes)
# ran alone at the end of the run. The order of the others is kept.
LONGEST_FIRST = ("tests/deploy/", "tests/bench/test_smoke.py", "tests/e2e/test_demo.py", "tests/e2e/test_readme.py")


def pytest_collection_modifyitems(items: list) -> None:
    def rank(item: object) -> int:
        nodeid: str = getattr(item, "nodeid", "")
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)
