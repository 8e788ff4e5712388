"""The OPE report and the ranking page in a real browser: they load with no console error, every plot
decodes, and nothing overflows a 1400-pixel window.

Debian's headless Chromium (``make chromium``, which ``make test`` runs) is driven through playwright,
launched on that binary: playwright's own browser download is never used. The test fails, never skips,
when the binary is missing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from ope_reports import build_report, simulated_logs
from playwright.sync_api import Browser, sync_playwright

from recsys_rl.ope.evaluate import EvaluateConfig, _Evaluation, rank
from recsys_rl.ope.gate import GateConfig, Verdict
from recsys_rl.ope.report import render, render_ranking

pytestmark = pytest.mark.integration

#: Debian's package names for the browser, headless shell first.
CHROMIUM_BINARIES = ("chromium-headless-shell", "chromium")
WIDTH = 1400


def chromium_binary() -> str:
    for name in CHROMIUM_BINARIES:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {list(CHROMIUM_BINARIES)} is installed: run `make chromium` (Debian's package)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_binary())
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full report (every section, ground truth included) and a ranking of two candidates, as files."""
    out = tmp_path_factory.mktemp("report-pages")
    report = build_report(simulated_logs())
    (out / "report.html").write_text(render(report))
    evaluations = []
    for version, passed in (("shifted-a", True), ("shifted-b", False)):
        copy = json.loads(json.dumps(report))
        copy["inputs"]["candidate"]["version"] = version
        verdict = Verdict(passed, () if passed else ("watch_time: lower bound -1.00% < required +0.00%",), ())
        evaluations.append(_Evaluation(version, copy, "", None, verdict))
    config = EvaluateConfig(candidates=("a", "b"), data="data", out="out", gate=GateConfig(**report["gate"]))
    ranking = rank(evaluations, config, SimpleNamespace(data_manifest=report["inputs"]["dataset"]))
    (out / "ranking.html").write_text(render_ranking(ranking))
    return {"report": out / "report.html", "ranking": out / "ranking.html"}


def _load(browser: Browser, path: Path) -> dict:
    """Open ``path`` at a 1400-pixel viewport; the console errors, page errors and layout facts."""
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.goto(path.as_uri(), wait_until="load")
    facts = page.evaluate(
        """() => ({
            scrollWidth: document.documentElement.scrollWidth,
            images: Array.from(document.images).map(i => [i.complete, i.naturalWidth]),
            title: document.title,
        })"""
    )
    # the listener itself must work, or "no errors" would mean nothing
    page.evaluate("console.error('probe')")
    page.wait_for_timeout(50)
    page.close()
    assert errors[-1:] == ["probe"], errors
    return {**facts, "errors": errors[:-1]}


@pytest.mark.parametrize(("name", "images"), [("report", 6), ("ranking", 1)])
def test_the_page_loads_cleanly_and_fits_1400_pixels(browser, pages, name, images):
    facts = _load(browser, pages[name])
    assert facts["errors"] == []
    assert facts["scrollWidth"] <= WIDTH, f"{name} is {facts['scrollWidth']} px wide"
    assert len(facts["images"]) == images
    assert all(complete and width > 0 for complete, width in facts["images"]), facts["images"]
