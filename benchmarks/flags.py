"""Comma-separated numeric flag values, shared by every benchmark's parser ('1,2,4' -> (1, 2, 4))."""
from __future__ import annotations

from dynspec.errors import DynspecError


def int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        xs = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DynspecError(f"{what} {text!r} is not a comma-separated list of integers") from None
    if not xs or min(xs) < 1:
        raise DynspecError(f"{what} {text!r} needs positive integers")
    return xs


def float_list(text: str, what: str) -> tuple[float, ...]:
    try:
        xs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DynspecError(f"{what} {text!r} is not a comma-separated list of numbers") from None
    if not xs or min(xs) <= 0:
        raise DynspecError(f"{what} {text!r} needs positive numbers")
    return xs
