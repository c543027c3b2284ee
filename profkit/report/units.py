"""Human units for tables and sentences (data stays in bytes and seconds)."""

from __future__ import annotations

import math


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def human_bytes(n) -> str:
    if _missing(n):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"


def signed_bytes(n) -> str:
    return ("+" if n > 0 else "") + human_bytes(n)


def human_seconds(s) -> str:
    if _missing(s):
        return "-"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.2f} ms"


def signed_ms(s) -> str:
    return f"{s * 1e3:+.2f} ms/step"


def mib(n):
    return None if _missing(n) else round(float(n) / 2**20, 3)


def ms(s):
    return None if _missing(s) else round(float(s) * 1e3, 3)
