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
