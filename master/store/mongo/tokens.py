"""Join tokens in MongoDB."""

from __future__ import annotations

from pymongo import ReturnDocument

from master.records import TokenRecord
from master.store.aggregates import Aggregate
from master.store.base import TokenOutcome
from master.store.mongo.collection import MongoCollection, set_fields


class MongoTokenRepo(MongoCollection[TokenRecord]):
    aggregate = Aggregate.TOKENS
    record_type = TokenRecord

    async def put(self, rec: TokenRecord) -> None:
        await self._upsert(rec.token_hash, rec)

    async def consume(self, token_hash: str, *, agent_id: str, now: float) -> tuple[TokenOutcome, TokenRecord | None]:
        # One atomic document update: of concurrent consumers only one matches "used_at": None. Matching None
        # is reliable on nx-27017 only next to an _id equality, as here.
        with self._metrics.timed_write(self.aggregate):
            spent = await self._c.find_one_and_update(
                {"_id": token_hash, "used_at": None, "expires_at": {"$gt": now}},
                set_fields({"used_at": now, "used_by": agent_id}),
                return_document=ReturnDocument.AFTER,
            )
        if spent is not None:
            record = self._decode_or_quarantine(spent)
            # Unreadable (quarantined) though it matched: no one enrolls with a token whose owner is unknown.
            return (TokenOutcome.OK, record) if record is not None else (TokenOutcome.UNKNOWN, None)
        token = await self._get(token_hash)
        if token is None:  # absent, or unreadable (quarantined)
            return TokenOutcome.UNKNOWN, None
        return (TokenOutcome.USED if token.used_at is not None else TokenOutcome.EXPIRED), token
