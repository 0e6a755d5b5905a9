"""How the CLI and the HTML report write numbers: dollars (`money`, the one formatter for them) and
durations. Plain strings, no rich.
"""

from __future__ import annotations

from typing import Any


def money(usd: Any, *, cents: bool = False, tiny: bool = False, missing: str = "?") -> str:
    """Dollars, the one way the CLI and the report write them; `missing` stands for an amount not known.

    By default the digits follow the amount, so a small cost does not read as nothing: '$12.34', '$0.123',
    '$0.0012' ('$0.00' for nothing at all). `cents`: to the cent with thousands separators, so a column of
    prices lines up ('$1,234.50'); with `tiny` too, an amount under a cent keeps four places ('$0.0012')."""
    if not isinstance(usd, (int, float)):
        return missing
    if cents:
        return f"${usd:.4f}" if tiny and usd < 0.01 else f"${usd:,.2f}"
    return f"${usd:.2f}" if usd >= 0.995 or usd == 0 else f"${usd:.3f}" if usd >= 0.01 else f"${usd:.4f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"
