"""Money: integer micro-units of the grid's currency inside, exact decimal strings outside. Never a float.

A price is micro-units per GPU-hour; a charge is price x GPUs x whole seconds / 3600, rounded down (the renter never
pays for a fraction of a micro-unit it did not use).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MICRO = 1_000_000
_AMOUNT = re.compile(r"^([0-9]{1,12})(?:\.([0-9]{1,6}))?\Z")


class BadAmount(ValueError):
    """Text that is not an amount of money."""


def parse_amount(text: str) -> int:
    """``"2.5"`` -> 2_500_000. At most six decimals; no sign, exponent or thousands separator."""
    match = _AMOUNT.fullmatch(text)  # as given: "12\n" or " 12" is not an amount (once "12\n" priced 12.00)
    if match is None:
        raise BadAmount(f"{text!r} is not an amount: write a decimal number such as 2.5 or 0.000125 (at most 6 decimals)")
    whole, frac = match.group(1), match.group(2) or ""
    return int(whole) * MICRO + int(frac.ljust(6, "0"))


def amount_text(number: int | float) -> str:
    """A number where an amount's text is expected (a spec file's ``bid = 0.5``) as that text: ``"0.5"``. Exact, never
    through float arithmetic: a float's shortest repr is the decimal that was written when it has at most 15
    significant digits (an amount the API takes has at most 15). NaN, infinities, negatives and more than six decimals
    are refused, and so is a float with more digits than it keeps (write that one as text)."""
    value = (Decimal(repr(number)) if isinstance(number, float) else Decimal(number)).normalize()
    if not value.is_finite():
        raise BadAmount(f"{number} is not an amount: write a decimal number such as 2.5 or 0.000125")
    if value < 0:
        raise BadAmount(f"{number} is negative: an amount is 0 or more")
    _, digits, exponent = value.as_tuple()
    if isinstance(exponent, int) and exponent < -6:
        raise BadAmount(f"{number} has more than 6 decimals: an amount is exact to the micro-unit (0.000001)")
    if isinstance(number, float) and len(digits) > 15:
        raise BadAmount(f"{number} has more digits than a number keeps exactly: write it as text, in quotes")
    text = format(value.copy_abs(), "f")
    parse_amount(text)  # at most 12 digits before the point, like any amount
    return text


def format_amount(micro: int) -> str:
    """2_500_000 -> ``"2.50"``; at least two decimals, more only when they are not zero: 1_234_567 -> ``"1.234567"``."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{whole}.{digits}"


def period_cost(price_per_gpu_hour: int, gpus: int, period_s: float) -> int:
    """What ``gpus`` GPUs cost for one metering period of ``period_s`` (whole seconds, rounded up) at the price, rounded
    up: the least a balance must hold for work at that price to start (a dust balance once started 28 GPUs)."""
    seconds = max(1, math.ceil(period_s))
    return -(-price_per_gpu_hour * gpus * seconds // 3600)


def affordable_price(available: int, gpus: int, period_s: float) -> int:
    """The highest price per GPU-hour at which ``available`` pays one metering period of ``gpus`` GPUs:
    ``period_cost(p, gpus, period_s) <= available`` exactly when ``p <= affordable_price(available, gpus, period_s)``."""
    seconds = max(1, math.ceil(period_s))
    return max(0, available) * 3600 // (max(1, gpus) * seconds)


def cost(price_per_gpu_hour: int, gpus: int, seconds: int) -> int:
    """What ``gpus`` GPUs cost for ``seconds`` whole seconds at ``price_per_gpu_hour`` micro-units, rounded down."""
    return price_per_gpu_hour * gpus * seconds // 3600
