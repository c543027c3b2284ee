"""Human units for tables and sentences (data stays in bytes and seconds)."""

from __future__ import annotations

import math
import re


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


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'8GiB', '7.5 GB', '512MiB' or a plain byte count."""

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write e.g. 8GiB, 7.5GB or 512MiB")
    return int(float(match.group(1)) * _UNITS[unit])
