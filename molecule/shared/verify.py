"""Helpers for the scenarios' verifiers (testinfra)."""

import time


def wait_for(check, timeout=90):
    """check() until it answers something true, for at most `timeout` seconds; its last answer, for the assert."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(2)
