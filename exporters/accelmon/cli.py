"""accelmon-exporter: the command line, in the style of node_exporter."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import sys
import threading
from typing import Sequence

from accelmon import __version__, health
from accelmon.cloudwatch import Publisher, check_boto3, cost_report
from accelmon.collectors import collectors, known_metrics
from accelmon.config import LOG_LEVELS, ConfigError, Settings, check_listen_address, load
from accelmon.exporter.registry import Paths
from accelmon.exporter.runtime import Exporter
from accelmon.exporter.server import IPNetwork, MetricsServer, notify_systemd
from accelmon.exporter.webconfig import WebConfig, load_web_config
from accelmon.host.tcp_sockets import connection_uids
from accelmon.scan import SCAN_FAILED, build_samplers, plan, scan_health

log = logging.getLogger("accelmon")


def options_help() -> str:
    """--help's closing text: every collector's options, as the config file sets them."""
    lines = ["collector options (config file: collectors: NAME: OPTION: VALUE; enabled: true, false or auto):"]
    for name, registration in collectors().items():
        lines.append(f"  {name}:")
        lines += [f"    {option.describe()}" for option in registration.options]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accelmon-exporter",
        description="Prometheus exporter for NVIDIA GPUs, AWS Neuron devices and InfiniBand ports.",
        epilog=options_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file; flags override it")
    p.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        help="address to serve /metrics on (default :19470)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS, mutual TLS and basic auth settings, in exporter-toolkit's format (as node_exporter)",
    )
    p.add_argument("--path.sysfs", dest="sysfs", metavar="DIR", help="sysfs mount point (default /sys)")
    p.add_argument("--path.procfs", dest="procfs", metavar="DIR", help="procfs mount point (default /proc)")
    p.add_argument("--path.devfs", dest="devfs", metavar="DIR", help="device directory (default /dev)")
    p.add_argument("--path.kmsg", dest="kmsg", metavar="FILE", help="the kernel log (default /dev/kmsg)")
    p.add_argument("--log.level", dest="log_level", choices=LOG_LEVELS, help="log level (default info)")
    p.add_argument(
        "--once",
        action="store_true",
        help="sample every enabled collector once, print the exposition and exit; exit status 1 if a collector failed. "
        "Waits first for values computed over a window: with GPM profiling on, one profiling interval (5 s by "
        "default), since GPM needs two samples that far apart",
    )
    p.add_argument(
        "--cloudwatch-cost",
        action="store_true",
        help="sample every enabled collector once and print what publishing the config's `cloudwatch:` metrics from "
        "this host would cost a month (metrics, PutMetricData requests, dollars at dated list prices), then exit",
    )
    p.add_argument(
        "--scan",
        action="store_true",
        help="check the health of every GPU once (no service needed), print a table (or JSON with --json) and exit: "
        "0 ok, 1 warning, 2 failure, 3 if the scan could not run (bad settings). Reads NVML (amdsmi on AMD GPUs), "
        "the fabric and the kernel log only",
    )
    p.add_argument("--check-config", action="store_true", help="check the settings and exit (0 if valid, 2 if not)")
    p.add_argument(
        "--json",
        action="store_true",
        help="with --check-config: print each collector's setting, options with defaults, whether it would run on "
        "this host and the device nodes it needs (systemd DeviceAllow=), as JSON; with --scan: the verdicts as JSON",
    )
    p.add_argument(
        "--compat",
        choices=("dcgm-exporter", "dcgm-exporter-only"),
        help="also serve another exporter's names from the same samples: dcgm-exporter's DCGM_FI_* series "
        "(the same as --collector.dcgm_compat); dcgm-exporter-only: instead of the nvml and profiling collectors' "
        "own series (dcgm_compat's replace_own)",
    )
    p.add_argument("--version", action="version", version=f"accelmon-exporter {__version__}")
    for name, registration in collectors().items():
        p.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=registration.help,
        )
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    settings = load(args.config)
    if args.listen_address:
        check_listen_address(args.listen_address)
        settings.listen_address = args.listen_address
    if args.log_level:
        settings.log_level = args.log_level
    given = (("sysfs", args.sysfs), ("procfs", args.procfs), ("devfs", args.devfs), ("kmsg", args.kmsg))
    overrides = {k: v for k, v in given if v}
    settings.paths = Paths(**{**vars(settings.paths), **overrides})
    for name in collectors():
        flag = getattr(args, f"collector_{name}")
        if flag is not None:
            settings.collector(name).enabled = flag
    if args.compat in ("dcgm-exporter", "dcgm-exporter-only"):
        settings.collector("dcgm_compat").enabled = True
    if args.compat == "dcgm-exporter-only":
        settings.collector("dcgm_compat").options["replace_own"] = True
    return settings


def scan(settings: Settings, as_json: bool) -> int:
    """--scan: the verdicts as a table or JSON; the exit status says the node's verdict."""
    verdict = scan_health(settings)
    sys.stdout.write(health.dumps(verdict) + "\n" if as_json else verdict.table())
    return verdict.exit_status()


def make_server(
    exporter: Exporter,
    address: str,
    web: WebConfig | None = None,
    allowed: tuple[IPNetwork, ...] = (),
    procfs: str | None = None,
) -> MetricsServer:
    """The /metrics server for `address` (HOST:PORT; port 0 for any free port), not yet started. With `procfs`, it
    tells a loopback client's socket owner from its net/tcp (root's keep slots of their own); without, none does."""
    host, port = check_listen_address(address, any_port=True)  # tests and benchmarks bind a free port
    version = f"accelmon-exporter/{__version__}"
    peer_uids = functools.partial(connection_uids, procfs) if procfs else None
    return MetricsServer(exporter.exposition, host.strip("[]"), port, version, web, allowed, peer_uids)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
        web = load_web_config(args.web_config_file) if args.web_config_file else None
        # boto3 is the host's concern (the role installs it with the exporter): the controller's check of the
        # settings does not need it, a start without it is refused.
        if settings.cloudwatch.enabled and not args.check_config and not args.cloudwatch_cost:
            check_boto3()
    except ConfigError as error:
        print(f"accelmon-exporter: {error}", file=sys.stderr)
        return SCAN_FAILED if args.scan else 2
    if args.check_config:
        if args.json:
            print(json.dumps(plan(settings), indent=2))
        else:
            print("accelmon-exporter: settings are valid")
        return 0
    if args.json and not args.scan:
        print("accelmon-exporter: --json goes with --check-config or --scan", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.scan:
        return scan(settings, args.json)
    samplers = build_samplers(settings)
    if args.cloudwatch_cost:
        exporter = Exporter(samplers)
        exporter.collect_once()
        exporter.stop()
        sampled = [state.latest for state in (sampler.state() for sampler in samplers) if state.latest is not None]
        print(cost_report(settings.cloudwatch, known_metrics(), sampled))
        return 0
    publisher = None
    if settings.cloudwatch.enabled and not args.once:
        publisher = Publisher(settings.cloudwatch, known_metrics())
        for sampler in samplers:
            sampler.sinks.append(publisher.observe)
    exporter = Exporter(
        samplers,
        extra_metrics=[publisher.self_metrics] if publisher else [],
        certificates_not_after=settings.certificates_not_after,
    )
    if args.once:
        text, failed = exporter.collect_once()
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        exporter.stop()
        if failed:
            log.error("collector(s) failed: %s", ", ".join(failed))
            return 1
        return 0
    try:
        server = make_server(exporter, settings.listen_address, web, settings.allowed_clients, settings.paths.procfs)
    except OSError as error:
        log.error("cannot listen on %s: %s", settings.listen_address, error)
        return 1
    stopping = threading.Event()

    def shut_down(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    exporter.start()
    if publisher is not None:
        publisher.start()
    server.start()
    log.info(
        "accelmon-exporter %s listening on %s (%s%s) with collectors: %s",
        __version__,
        settings.listen_address,
        "https" if web and web.ssl_context else "http",
        ", basic auth" if web and web.requires_auth else "",
        ", ".join(s.name for s in exporter.samplers) or "none",
    )
    notify_systemd("READY=1")
    if publisher is not None:
        log.info(
            "publishing %d metric(s) to CloudWatch namespace %s every %g s",
            len(settings.cloudwatch.metrics),
            settings.cloudwatch.namespace,
            settings.cloudwatch.period_seconds,
        )
    stopping.wait()
    server.stop()
    exporter.stop()
    if publisher is not None:
        publisher.stop()
    return 0
