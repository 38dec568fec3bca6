"""A clock tests move by hand, for code that takes its time as an argument."""

from __future__ import annotations


class Clock:
    """A clock the test moves by hand (`clock.now = ...`), for the fleet's lease deadlines."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
