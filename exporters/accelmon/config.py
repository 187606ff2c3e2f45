"""The exporter's settings: defaults, then the YAML config file, then command-line flags."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from accelmon.cloudwatch import CloudWatchSettings, parse_settings
from accelmon.collectors import collectors, known_metrics
from accelmon.exporter.registry import ConfigError, Paths
from accelmon.exporter.server import IPNetwork, allowed_networks

DEFAULT_PORT = 19470
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"
LOG_LEVELS = ("debug", "info", "warning", "error")
# The services whose certificate's end the deploy writes in web.certificates_not_after (a label's bounded values).
CERTIFICATE_SERVICES = ("accelmon-exporter", "node_exporter")
__all__ = ["ConfigError", "Settings", "check_listen_address", "load"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (it silently kept the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


@dataclass
class CollectorSettings:
    enabled: bool | None = None  # None: the collector's own default for this host
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Settings:
    listen_address: str = DEFAULT_LISTEN_ADDRESS
    # The only addresses /metrics answers (the Prometheus servers); () answers any.
    allowed_clients: tuple[IPNetwork, ...] = ()
    # The end (seconds since the epoch) of each certificate the deploy gave this host's exporters, by service.
    certificates_not_after: dict[str, float] = field(default_factory=dict)
    log_level: str = "info"
    paths: Paths = field(default_factory=Paths)
    collectors: dict[str, CollectorSettings] = field(default_factory=dict)
    cloudwatch: CloudWatchSettings = field(default_factory=CloudWatchSettings)

    def collector(self, name: str) -> CollectorSettings:
        return self.collectors.setdefault(name, CollectorSettings())


def _expect_mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _unknown(mapping: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _certificates_not_after(value: Any) -> dict[str, float]:
    where = "web.certificates_not_after"
    ends = _expect_mapping(value, where)
    _unknown(ends, set(CERTIFICATE_SERVICES), where)
    for service, end in ends.items():
        # A real time: not a bool (YAML's yes), NaN, infinity, a negative or a number past the year 30000.
        if isinstance(end, bool) or not isinstance(end, (int, float)) or not (0 < end < 1e12 and math.isfinite(end)):
            raise ConfigError(
                f"{where}.{service}: expected the certificate's end in seconds since the epoch, got {end!r}"
            )
    return {service: float(end) for service, end in ends.items()}


def check_listen_address(address: str, any_port: bool = False) -> tuple[str, int]:
    """(host, port) of HOST:PORT; port 0 (any free port) only where `any_port` says a caller wants one."""
    host, sep, port = address.rpartition(":")
    # ASCII digits only (full-width digits pass str.isdigit), and a real port: 0 would listen on a random one.
    lowest = 0 if any_port else 1
    if not sep or not (port.isascii() and port.isdigit()) or not lowest <= int(port) < 65536:
        raise ConfigError(f"listen address {address!r}: expected HOST:PORT, :PORT or [IPv6]:PORT")
    return host.strip("[]"), int(port)


def _share_options(settings: Settings, registry: dict[str, Any]) -> None:
    """A shared option (one setting several collectors declare, such as the job collectors' state_dir) set on one
    collector holds for all of them; set to different values, the config is refused: they would disagree."""
    holders: dict[str, list[str]] = {}
    for name, registration in registry.items():
        for option in registration.options:
            if option.shared:
                holders.setdefault(option.name, []).append(name)
    for key, names in holders.items():
        chosen = {
            name: settings.collectors[name].options[key]
            for name in names
            if name in settings.collectors and key in settings.collectors[name].options
        }
        if len(set(chosen.values())) > 1:
            given = ", ".join(f"collectors.{name}.{key}={value!r}" for name, value in chosen.items())
            raise ConfigError(
                f"{key} is one setting shared by {', '.join(names)}; it was given different values: {given}"
            )
        if chosen:
            value = next(iter(chosen.values()))
            for name in names:
                settings.collector(name).options[key] = value


def load(path: str | None) -> Settings:
    settings = Settings()
    if path is None:
        return settings
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.load(stream, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except OSError as error:
        raise ConfigError(f"config file {path}: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path}: not valid YAML: {error}") from error
    data = _expect_mapping(data, path)
    _unknown(data, {"web", "log_level", "paths", "collectors", "cloudwatch"}, path)
    web = _expect_mapping(data.get("web"), "web")
    _unknown(web, {"listen_address", "allowed_clients", "certificates_not_after"}, "web")
    if "listen_address" in web:
        settings.listen_address = str(web["listen_address"])
        check_listen_address(settings.listen_address)
    if "allowed_clients" in web:
        try:
            settings.allowed_clients = allowed_networks(web["allowed_clients"])
        except ValueError as error:
            raise ConfigError(f"web.allowed_clients: {error}") from error
    settings.certificates_not_after = _certificates_not_after(web.get("certificates_not_after"))
    if "log_level" in data:
        if data["log_level"] not in LOG_LEVELS:
            raise ConfigError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {data['log_level']!r}")
        settings.log_level = data["log_level"]
    paths = _expect_mapping(data.get("paths"), "paths")
    _unknown(paths, {"sysfs", "procfs", "devfs", "kmsg"}, "paths")
    for key, value in paths.items():
        if not isinstance(value, str) or not value:  # null and lists became the paths "None" and "['a']"
            raise ConfigError(f"paths.{key}: expected a path, got {value!r}")
    settings.paths = Paths(**{**vars(settings.paths), **paths})
    registry = collectors()
    chosen_collectors = _expect_mapping(data.get("collectors"), "collectors")
    _unknown(chosen_collectors, set(registry), "collectors")
    for name, raw in chosen_collectors.items():
        options = _expect_mapping(raw, f"collectors.{name}")
        registration = registry[name]
        _unknown(options, {"enabled", *registration.defaults}, f"collectors.{name}")
        chosen = settings.collector(name)
        if "enabled" in options:
            enabled = options["enabled"]
            if enabled not in (True, False, "auto"):
                raise ConfigError(f"collectors.{name}.enabled: expected true, false or auto, got {enabled!r}")
            chosen.enabled = None if enabled == "auto" else enabled
        for key, value in options.items():
            if key != "enabled":
                chosen.options[key] = registration.option(key).check(value, f"collectors.{name}.{key}")
    _share_options(settings, registry)
    settings.cloudwatch = parse_settings(data.get("cloudwatch"), known_metrics())
    return settings
