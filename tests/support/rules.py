"""The master's rule files as a master's Prometheus evaluates them (master/prometheus/render_live_jobs.py): made once
per test process, on first use, in a directory removed when the process ends."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from tests.support.paths import ROOT

SCRIPT = "render_live_jobs.py"


def load_renderer() -> ModuleType:
    """master/prometheus/render_live_jobs.py as a module (a script beside the rules, not a package)."""
    spec = importlib.util.spec_from_file_location("render_live_jobs", ROOT / "master" / "prometheus" / SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def master_rules() -> Path:
    """A directory with rules/ (every rule file, the live job rules rendered at the role's defaults) and tests/
    (promtool's tests, whose rule_files name ../rules/)."""
    out = Path(tempfile.mkdtemp(prefix="accelmon-rules-"))
    atexit.register(shutil.rmtree, out, True)
    load_renderer().write_rules(out)
    return out


def rule_files() -> list[Path]:
    return sorted((master_rules() / "rules").glob("*.yml"))
