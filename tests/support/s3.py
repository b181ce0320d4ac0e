"""A real S3-compatible server for the storage tests: moto in server mode (``ThreadedMotoServer``) on
127.0.0.1, with real HTTP, SigV4 signatures and multipart uploads. Its credentials check is on
(``INITIAL_NO_AUTH_ACTION_COUNT`` 0), so wrong keys are refused as a real store refuses them; moto's IAM accepts any key
pair the test creates as a user."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config

from common.egress import EgressRule


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key_id: str
    secret_access_key: str

    @property
    def allowed(self) -> str:
        """The entry a provider or operator writes in ``egress_allow`` to let renters use this store: moto listens on
        127.0.0.1, which the egress rule refuses unless allowed by name."""
        return self.endpoint.removeprefix("http://")

    @property
    def provider_allows(self) -> EgressRule:
        """An agent's egress rule whose provider allows this store."""
        return EgressRule.allowing([self.allowed])

    @property
    def credentials(self) -> str:
        """As a renter stores them in a secret."""
        return f"{self.access_key_id}:{self.secret_access_key}"

    def client(self) -> Any:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 6}),
        )

    def put_large(self, bucket: str, key: str, body: bytes) -> None:
        """Store ``body`` as a multipart upload of 16 MB parts, each sent (and retried) on its own: CI saw a single PUT
        of 200 MB to moto fail on a loaded machine 7 times over (its connection closed before the answer)."""
        from boto3.s3.transfer import TransferConfig

        parts = TransferConfig(multipart_threshold=16 * 1024 * 1024, multipart_chunksize=16 * 1024 * 1024, max_concurrency=2)
        self.client().upload_fileobj(io.BytesIO(body), bucket, key, Config=parts)


@contextmanager
def moto_s3() -> Iterator[S3Server]:
    """A moto server with one IAM user whose keys may do everything; stopped on exit. One per process (moto
    counts its unauthenticated requests once per process)."""
    # moto checks credentials only after its first N requests: the three that make the test's user.
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # port 0: the kernel picks a free one
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        iam = boto3.session.Session().client(
            "iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        iam.create_user(UserName="renter")
        iam.put_user_policy(
            UserName="renter",
            PolicyName="all",
            PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}',
        )
        keys = iam.create_access_key(UserName="renter")["AccessKey"]
        yield S3Server(endpoint, keys["AccessKeyId"], keys["SecretAccessKey"])
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One real S3-compatible server (moto, real HTTP and SigV4) for the session's storage tests."""
    with moto_s3() as server:
        yield server
