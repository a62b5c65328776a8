"""Seconds for people: 45s, 12m, 5h07m, 3d04h (one spelling for every ops command)."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """`seconds` rounded to its two largest units: 45s, 12m, 5h07m, 3d04h; never for infinity."""
    if math.isinf(seconds):
        return "never"
    s = round(seconds)
    if s < 90:
        return f"{s}s"
    if s < 90 * 60:
        return f"{round(s / 60)}m"
    hours, minutes = divmod(round(s / 60), 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(round(s / 3600), 24)
    return f"{days}d{hours:02d}h"
