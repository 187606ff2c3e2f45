"""README and docs/: every relative link reaches a file of the repository, and every anchor a heading of it, as
a code forge renders them (GitHub's heading slugs). README stays short: the rest lives in docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "ansible").rglob("README.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"^#{1,6} ", line)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # an address outside the repository
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
        assert ROOT in linked.parents or linked == ROOT, f"{page.relative_to(ROOT)}: {target} leaves the repository"
        if anchor:
            assert linked.is_file() and anchor in anchors(linked), f"{page.relative_to(ROOT)}: no heading for #{anchor}"


def test_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    commands = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert commands and commands.group(1).startswith("./scripts/demo.sh") and "./scripts/test.sh" in commands.group(1)


def test_the_slug_is_githubs():
    assert slug("Scaling out: shards, HA pairs, a global store") == "scaling-out-shards-ha-pairs-a-global-store"
    assert slug("The exporter: `accelmon-exporter`") == "the-exporter-accelmon-exporter"


@pytest.mark.e2e
def test_the_test_script_fails_when_its_tests_fail():
    """`scripts/test.sh` keeps each tier's status: a pytest run that fails (here: no test selected, status 5) is
    the script's exit status, not lost behind the time report."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), "--quick", "--", "-k", "no_test_has_this_name"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-2000:]
    assert "--- time by tier ---" in result.stdout
