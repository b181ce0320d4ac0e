"""Error classes shared by every part. Each carries a stable machine-readable code."""

from __future__ import annotations


class IdlegridError(Exception):
    """Base of all idlegrid errors; ``code`` is stable and goes on the wire and into API errors."""

    code = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(IdlegridError):
    code = "bad_config"


class ProtocolError(IdlegridError):
    """A frame that cannot be accepted. ``code`` is one of the wire error codes."""

    code = "bad_frame"


class PKIError(IdlegridError):
    code = "pki"


class SignatureError(PKIError):
    code = "bad_signature"


class EnrollmentError(IdlegridError):
    code = "enrollment_refused"


class NotFound(IdlegridError):
    code = "not_found"


class Conflict(IdlegridError):
    code = "conflict"


class InvalidTransition(IdlegridError):
    code = "invalid_transition"


class RuntimeFailure(IdlegridError):
    """A container runtime could not do what a command asked."""

    code = "runtime_failure"


class NvmlUnavailable(IdlegridError):
    code = "nvml_unavailable"


class SubscriptionClosed(IdlegridError):
    """A change-feed subscription was closed: nothing more will arrive on it."""

    code = "subscription_closed"


class InvalidAccount(IdlegridError):
    """An account, or a change to one, that breaks a rule; the message names the field."""

    code = "bad_request"


# --- the market ---------------------------------------------------------------------------------------------------


class InvalidPrice(IdlegridError):
    """A price a provider set that breaks a rule (a negative or malformed amount, a discount out of range, ...);
    the message names the field."""

    code = "bad_request"


class InvalidRating(IdlegridError):
    """A renter's rating that is not a whole number from 1 to 5, or of a rental that cannot be rated."""

    code = "bad_request"


class BadQuery(IdlegridError):
    """An offer search query that does not parse or names a field or value the offers do not have. ``position`` is
    the 0-based character where the trouble starts, ``token`` the text found there; the message says both."""

    code = "bad_request"

    def __init__(self, message: str, *, position: int = 0, token: str = "") -> None:
        super().__init__(message)
        self.position = position
        self.token = token


class InvalidPassword(IdlegridError):
    """A password that cannot be set (too short, too long), or a current password that does not match."""

    code = "bad_request"


class SignInRefused(IdlegridError):
    """Sign-in with a password failed: the same answer for an unknown account, a wrong password and an account with
    no password, so that it tells nothing about which accounts exist."""

    code = "unauthorized"


class InvalidAlertSetting(IdlegridError):
    """An alert rule, silence or webhook that cannot be accepted (a bad field, an expiry in the past, a URL that is
    not http(s)); the message names the field."""

    code = "bad_request"


class InvalidTelemetryWindow(IdlegridError):
    """A telemetry history query whose window or step cannot be answered (``to`` before ``from``, a step that is not
    a whole number of minutes, too many points); the message names the parameter and what would do."""

    code = "bad_request"


class Fenced(IdlegridError):
    """A store write refused because this Master no longer holds the leader lease (docs/ha.md): it must step down."""

    code = "fenced"


# --- backup and restore (master/backup.py, docs/backup.md) ---------------------------------------------------------


class BackupError(IdlegridError):
    """A backup that cannot be made or restored: a truncated or altered archive, a schema newer than this idlegrid, a
    target directory in use or not empty, an output file already there. The message says which, and what would do."""

    code = "backup"


# --- whose fault a container that did not start is (docs/images.md) -----------------------------------------------


class RenterFault(RuntimeFailure):
    """A container that could not start because of what the renter asked for (an image that does not exist or that
    the renter's credentials do not open, one too large for the host, a registry the host does not pull from, a
    command the image lacks): the workload fails with this message, and the host's reputation is not touched."""

    code = "renter_fault"


class ImageNotFound(RenterFault):
    code = "image_not_found"


class ImageUnauthorized(RenterFault):
    code = "image_unauthorized"


class ImageTooLarge(RenterFault):
    code = "image_too_large"


class RegistryNotAllowed(RenterFault):
    code = "registry_not_allowed"


class ImagePullTimeout(RenterFault):
    """The renter chose the registry and the image; a registry too slow to serve it within the host's pull timeout
    must not cost the host reputation (else a renter's own slow registry could ruin any host's)."""

    code = "image_pull_timeout"


class BadCommand(RenterFault):
    code = "bad_command"


class RenterOutOfMemory(RenterFault):
    code = "renter_out_of_memory"


class StorageUnauthorized(RenterFault):
    """The object store refused the renter's credentials (wrong keys, no permission on the bucket or prefix)."""

    code = "storage_unauthorized"


class StorageNotFound(RenterFault):
    """The renter's bucket, or an input object, does not exist at the endpoint the workload names."""

    code = "storage_not_found"


class StorageTooLarge(RenterFault):
    """The renter's inputs or checkpoint do not fit in what this host gives storage (its cache budget, its free disk)."""

    code = "storage_too_large"


class StorageUnreachable(RenterFault):
    """The renter's endpoint did not answer (the renter chose it: a dead endpoint must not cost the host reputation)."""

    code = "storage_unreachable"


class EgressRefused(RenterFault):
    """A target the renter named (a storage endpoint, an image registry, a webhook) that is, or resolves to, an address
    the grid does not connect to on a renter's behalf (common/egress.py): the message says which and what to change."""

    code = "egress_refused"


RENTER_FAULT_CODES = frozenset(
    cls.code
    for cls in (
        RenterFault,
        ImageNotFound,
        ImageUnauthorized,
        ImageTooLarge,
        RegistryNotAllowed,
        ImagePullTimeout,
        BadCommand,
        RenterOutOfMemory,
        StorageUnauthorized,
        StorageNotFound,
        StorageTooLarge,
        StorageUnreachable,
        EgressRefused,
    )
)


def is_renter_fault(code: str | None) -> bool:
    """Whether a command's ``error_code`` says the renter's request, not the host, made it fail."""
    return code in RENTER_FAULT_CODES
