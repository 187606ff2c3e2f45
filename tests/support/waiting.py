"""Waiting for an event in a test, never for a fixed time: on a busy 2-core machine a sleep that is long enough
today is too short tomorrow, and a wall-clock bound asserted after it fails by chance. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 15.0, what: str = "the condition", every: float = 0.02
) -> T:
    """`predicate()`'s first truthy answer, asked every `every` seconds; an AssertionError naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s")
        time.sleep(every)


def returns_while_blocked(call: Callable[[], T], limit: float = 10.0) -> T:
    """`call()`'s result, run in a thread while something else stays blocked: a call that waited on the blocked
    thing would never return, so `limit` is a hang detector, generous on purpose (not a speed measurement)."""
    result: list[T] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(limit)
    assert result, f"the call did not return within {limit:g} s: it waits on what is blocked"
    return result[0]
