"""The renter's object store reached through the egress rule (common/egress.py): every connection boto3 makes is
judged after resolution, on the addresses it then connects to, and no redirect is followed.

Why at the connection, not before a call: a check of the endpoint's name before each call and a connection that
resolves the name again would leave a gap a DNS answer can change in (DNS rebinding: public for the check, 127.0.0.1
for the connection), and boto3 opens connections of its own at any time (retries, parallel parts, a pool refilled).
So the connection itself resolves, through ``EgressRule.addresses``, and connects to exactly the addresses judged,
never to the name: urllib3's connection (which botocore's subclasses) makes its socket in ``_new_conn``, the one
place every new connection passes, and TLS still verifies the certificate against the name (``server_hostname`` is
the host, not the address). botocore has no public seam for its connection classes, so ``guard`` installs them in the
client's HTTP session's pool manager and fails closed (``RuntimeError``) if a botocore release moves them.

Redirects: botocore sends every request with urllib3's retries and redirects off (``Retry(False)``), so an HTTP 3xx
comes back as an answer; the only redirects it follows are its own S3 region redirector's (a 301, or a 400 naming
another region: the same request again, signed for the region the answer names, at the endpoint that region resolves
to). ``guard`` registers a handler ahead of it that refuses any 3xx answer, so the renter is told to name the right
endpoint and region; a region mismatch without a redirect still reaches only the endpoint's own host.

An agent that reaches the internet through an HTTP proxy (HTTPS_PROXY): the connection made is the proxy's, and the
rule judges the proxy's address; a provider who allows a private proxy by name relies on the proxy's own rules.
"""

from __future__ import annotations

import socket
from typing import Any

from botocore.awsrequest import AWSHTTPConnection, AWSHTTPConnectionPool, AWSHTTPSConnection, AWSHTTPSConnectionPool
from botocore.exceptions import HTTPClientError
from botocore.httpsession import URLLib3Session
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

from common.egress import EgressRule
from common.errors import EgressRefused


def _checked_conn(conn: Any, rule: EgressRule) -> socket.socket:
    """A socket to one of the addresses ``conn``'s host resolves to, all judged by ``rule`` first."""
    what = f"storage endpoint {conn.host}"
    try:
        addresses = rule.addresses(what, conn._dns_host, conn.port)
    except socket.gaierror as exc:
        raise NameResolutionError(conn.host, conn, exc) from exc
    except OSError as exc:
        raise NewConnectionError(conn, f"Failed to resolve {conn.host}: {exc}") from exc
    last: OSError | None = None
    for address in addresses:  # each judged address in the resolver's order; never the name again
        try:
            return connection.create_connection(
                (str(address), conn.port), conn.timeout, source_address=conn.source_address, socket_options=conn.socket_options
            )
        except TimeoutError as exc:
            last = exc
            error: Exception = ConnectTimeoutError(conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})")
        except OSError as exc:
            last = exc
            error = NewConnectionError(conn, f"Failed to establish a new connection: {exc}")
    raise error from last


def checked_pool_classes(rule: EgressRule) -> dict[str, type]:
    """botocore's connection pools for http and https whose connections go through ``rule``."""

    class CheckedHTTPConnection(AWSHTTPConnection):
        def _new_conn(self) -> socket.socket:
            return _checked_conn(self, rule)

    class CheckedHTTPSConnection(AWSHTTPSConnection):
        def _new_conn(self) -> socket.socket:
            return _checked_conn(self, rule)

    class CheckedHTTPConnectionPool(AWSHTTPConnectionPool):
        ConnectionCls = CheckedHTTPConnection

    class CheckedHTTPSConnectionPool(AWSHTTPSConnectionPool):
        ConnectionCls = CheckedHTTPSConnection

    return {"http": CheckedHTTPConnectionPool, "https": CheckedHTTPSConnectionPool}


def guard(client: Any, rule: EgressRule) -> Any:
    """``client`` (a boto3 S3 client, before its first request) with its connections judged by ``rule`` and redirects
    refused; RuntimeError when this botocore keeps its connections elsewhere (nothing unchecked is ever sent)."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    manager: Any = getattr(session, "_manager", None)
    if not isinstance(session, URLLib3Session) or not hasattr(manager, "pool_classes_by_scheme"):
        raise RuntimeError("this botocore's HTTP session is not the one the egress rule knows; storage is off")
    classes = checked_pool_classes(rule)
    session._pool_classes_by_scheme = classes  # proxy managers made later read these
    manager.pool_classes_by_scheme = classes
    client.meta.events.register_first("needs-retry.s3", _refuse_redirects_and_egress)
    return client


def _refuse_redirects_and_egress(response: Any = None, caught_exception: Any = None, **_: Any) -> None:
    """Ahead of botocore's retries and its region redirector: a refused connection is not retried (botocore wraps it
    as an HTTPClientError, which it would retry), and a redirect is refused rather than followed."""
    if isinstance(caught_exception, HTTPClientError):
        inner = caught_exception.kwargs.get("error")
        while inner is not None and not isinstance(inner, EgressRefused):
            inner = inner.__cause__ or inner.__context__
        if isinstance(inner, EgressRefused):
            raise inner
    if response is not None:
        status = int(response[1].get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if 300 <= status < 400:
            headers = response[1].get("ResponseMetadata", {}).get("HTTPHeaders", {})
            where = headers.get("location") or headers.get("x-amz-bucket-region") or "elsewhere"
            raise EgressRefused(
                f"the storage endpoint answered with a redirect ({status}, to {where}), which is not followed; "
                "name the endpoint (and region) that holds the bucket"
            )
