"""Account passwords for the console's sign-in: argon2id hashes, checked in constant time.

Only the hash is stored (on the account record, ``password_hash``); a password is never logged or returned. Checking a
password for an account that has none, or that does not exist, still runs one argon2 verification against a fixed
hash, so the answer and its time are the same as for a wrong password: sign-in tells nothing about which accounts exist.
Hashing costs tens of milliseconds of CPU by design; callers run it off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

from functools import lru_cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from common.errors import InvalidPassword

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024  # argon2 takes any length; a bound keeps one request from costing more than another

_HASHER = PasswordHasher()  # argon2id with the library's current recommended costs


def check_new_password(password: str) -> None:
    """InvalidPassword naming what is wrong with a password about to be set."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidPassword(f"password: at least {MIN_PASSWORD_LENGTH} characters, got {len(password)}")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise InvalidPassword(f"password: at most {MAX_PASSWORD_LENGTH} characters, got {len(password)}")
    if not password.strip():
        raise InvalidPassword("password: must not be only spaces")


def hash_password(password: str) -> str:
    check_new_password(password)
    return _HASHER.hash(password)


@lru_cache(maxsize=1)
def _stand_in_hash() -> str:
    """What a password is checked against when there is no hash to check it against (made once, on first use)."""
    return _HASHER.hash("no account has this password: it only makes a refusal take as long as any other")


def password_matches(stored_hash: str, password: str) -> bool:
    """Whether ``password`` matches ``stored_hash``; with ``stored_hash`` "" (none set) always False, after the same
    work as a real check. Passwords longer than any that can be set are checked (and fail) the same way."""
    candidate = password[: MAX_PASSWORD_LENGTH + 1]
    target = stored_hash or _stand_in_hash()
    matched: bool
    try:
        matched = _HASHER.verify(target, candidate)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        matched = False
    return matched and bool(stored_hash) and len(password) <= MAX_PASSWORD_LENGTH
