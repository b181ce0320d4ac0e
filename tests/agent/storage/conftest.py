from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.s3 import S3Server, moto_s3


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One real S3-compatible server (moto, real HTTP and SigV4) for the session's storage tests."""
    with moto_s3() as server:
        yield server
