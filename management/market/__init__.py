"""The market: offers and their search, prices and bids, rentals, metering and the double-entry ledger.

docs/market.md tells the whole story. Money is integer micro-units everywhere inside (``money``); prices and bids are
inputs of the scheduler (management/scheduler/), which alone places and preempts.
"""
