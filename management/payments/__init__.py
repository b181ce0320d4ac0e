"""Money in and out of the grid through a payment provider (docs/payments.md).

``provider.py`` is the interface the grid calls (a ``typing.Protocol``) and the typed events it answers;
``stripe_provider.py`` its adapter on the official ``stripe`` SDK; ``topups.py`` the pure rules of a top-up (bounds,
minor units, what a verified event does to the ledger); ``records.py`` what the store keeps of top-ups and of the
provider's events.
"""
