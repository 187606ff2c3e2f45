"""accelmon-oar-health: an OAR node check (OAR's oarnodecheck mechanism, /etc/oar/check.d). It runs the exporter's
health scan (`--scan`: the same checks the served verdicts and the alerts use) and, when a check fails, writes a
check log naming the GPUs, the checks and the actions to the file OAR names in CHECKLOGFILE. OAR's ping checker
(`oarnodecheckquery`) then finds the log and OAR suspects the node: it takes no new jobs. The log stays until the
operator, having looked at the GPU, removes it (`oarnodechecklist` lists them): accelmon never clears one.

OAR's contract for a check (its oarnodecheck README and template): create the log only when the check found a
problem. So a warning, a scan that cannot run (a bad config) or a healthy node write nothing; this always exits 0.
docs/health.md has the oar.conf lines; the role installs it (accelmon_exporter_oar_health_check).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from accelmon.scan import hook_scan

log = logging.getLogger("accelmon.oar.health")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelmon-oar-health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the exporter's config file (its paths and collector settings)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="accelmon-oar-health: %(message)s")
    log.setLevel(logging.INFO)
    scanned = hook_scan(args.config, log, "no check log left")
    if scanned is None or scanned[1].verdict != "failure":
        return 0
    verdict = scanned[1]
    reason = verdict.drain_reason()
    checklog = os.environ.get("CHECKLOGFILE")
    if not checklog:  # run by hand, not by oarnodecheckrun: say it
        log.warning("would leave a check log: %s", reason)
        return 0
    try:
        with open(checklog, "a", encoding="utf-8") as stream:
            stream.write(reason + "\n")
    except OSError as error:
        log.error("cannot write the check log %s: %s (%s)", checklog, error.strerror, reason)
        return 0
    log.warning("left a check log for OAR: %s", reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
