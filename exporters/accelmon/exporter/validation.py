"""What every setting of accelmon is checked with: the typed `Option` (a collector's settings, dcgm_compat's, ...),
`ConfigError` naming the setting, and the number checks they share (the config file, the web config, CloudWatch)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Union

# No option in seconds below this: 1e-9 made a sampler spin a whole core.
MIN_SECONDS = 0.1

OptionValue = Union[bool, float, str]


class ConfigError(ValueError):
    """A setting is wrong; the message names it."""


@dataclass(frozen=True)
class Option:
    """One setting (`collectors.NAME.OPTION` in the config file, or a key of `cloudwatch:`): its default gives its
    type: a bool, a number (bounded by `minimum` and `maximum`, whole numbers only with `whole`) or a string (one of
    `choices` if given; empty only with `empty`)."""

    name: str
    default: OptionValue
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # numbers: the smallest value accepted (always more than 0)
    maximum: float | None = None  # numbers: the largest
    whole: bool = False  # numbers: whole numbers only
    empty: bool = False  # strings: the empty string is accepted (it means "not set")
    must_contain: tuple[str, ...] = ()  # strings: at least one of these must appear (a command's placeholders)
    # strings: (a pattern each space-separated word must match whole, the accepted forms in words): a list of selectors
    words: tuple[str, str] = ("", "")
    # strings: several things (addresses, units, selectors): a YAML list of them is accepted as well as one string
    # of them separated by spaces, and kept as that string
    several: bool = False
    # Declared by several collectors as one setting (the job collectors' state_dir): set on one, it holds for all.
    shared: bool = False

    def check(self, value: Any, where: str) -> OptionValue:
        """value, if it suits this option; ConfigError naming `where` otherwise."""
        if isinstance(self.default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: expected true or false, got {value!r}")
            return value
        if isinstance(self.default, (int, float)):
            return self._number(value, where)
        if self.several and isinstance(value, list):
            value = self._joined(value, where)
        if not isinstance(value, str) or (not value and not self.empty):
            kind = "a string" if self.empty else "a non-empty string"
            raise ConfigError(f"{where}: expected {kind}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}: expected one of {', '.join(self.choices)}, got {value!r}")
        if self.must_contain and not any(part in value for part in self.must_contain):
            raise ConfigError(f"{where}: expected {' or '.join(self.must_contain)} in it, got {value!r}")
        pattern, forms = self.words
        wrong = [word for word in value.split() if pattern and not re.fullmatch(pattern, word)]
        if wrong:
            raise ConfigError(f"{where}: expected {forms}, got {wrong[0]!r}")
        return value

    def _joined(self, items: list[Any], where: str) -> str:
        """A list of several things as the one string they are kept as; each must be a string without spaces."""
        for item in items:
            if not isinstance(item, str) or not item or item.split() != [item]:
                raise ConfigError(f"{where}: expected a list of strings without spaces, got {item!r} in it")
        return " ".join(items)

    def _number(self, value: Any, where: str) -> float:
        number = finite(value)
        if self.maximum is not None:
            lowest = self.minimum if self.minimum is not None else 0
            if number is None or not lowest <= number <= self.maximum or number <= 0:
                raise ConfigError(f"{where}: expected a number from {lowest:g} to {self.maximum:g}, got {value!r}")
        elif number is None or number <= 0:
            raise ConfigError(f"{where}: expected a positive number, got {value!r}")
        elif self.minimum is not None and number < self.minimum:
            raise ConfigError(f"{where}: expected at least {self.minimum:g}, got {value!r}")
        if self.whole and number != int(number):
            raise ConfigError(f"{where}: expected a whole number, got {value!r}")
        return number

    def describe(self) -> str:
        """One line for --help: name, default, bounds or choices, meaning."""
        if isinstance(self.default, bool):
            default = str(self.default).lower()
        elif isinstance(self.default, float):
            default = f"{self.default:g}"
        else:
            default = self.default or '""'
        bounds = f"; one of {', '.join(self.choices)}" if self.choices else ""
        if self.maximum is not None:
            bounds += f"; from {self.minimum if self.minimum is not None else 0:g} to {self.maximum:g}"
        elif self.minimum is not None:
            bounds += f"; at least {self.minimum:g}"
        if self.shared:
            bounds += "; one setting for every collector that has it"
        if self.several:
            bounds += "; a list, or one string separated by spaces"
        return f"{self.name} (default {default}{bounds}): {self.help}"


def seconds(name: str, default: float, text: str) -> Option:
    """A duration option, never under MIN_SECONDS."""
    return Option(name, float(default), text, minimum=MIN_SECONDS)


def finite(value: Any) -> float | None:
    """value as a finite float, or None: .inf killed a sampler thread, .nan made it spin, 10**400 overflowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
