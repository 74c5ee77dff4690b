"""The HTML report in a real headless Chromium: it loads without script errors, shows one
grid cell per record, and a cell opens its record, log tail and repro commands.

Needs Debian's chromium and chromium-driver (`kvrig setup packages chromium
chromium-driver`); `nox -s tests` installs them and sets KVRIG_NEED_BROWSER=1, so there a
missing browser fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvrig.publish import report, results

from ..records import OTHER, REQUIRED, row

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM and DRIVER):
        message = (
            "headless Chromium is not installed: kvrig setup packages chromium chromium-driver"
        )
        if os.environ.get("KVRIG_NEED_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _results(folder: Path) -> list[dict[str, Any]]:
    rows = [
        row(REQUIRED, "pass"),
        row(OTHER, "fail", reason="expected an early error; the engine ran at 384"),
    ]
    for r in rows:
        results.append(folder, r)
        (folder / "records").mkdir(exist_ok=True)
        (folder / "records" / f"{r['cell_id']}.json").write_text(json.dumps({"outcome": "ran"}))
    (folder / "logs").mkdir()
    (folder / "logs" / f"{OTHER}.log").write_text("INFO starting\nINFO block size 384 chosen\n")
    return rows


def _severe(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_report_page_loads_and_each_cell_opens_its_details(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    folder = tmp_path / "cpu"
    rows = _results(folder)
    _, page = report.write(folder)
    browser.get(page.as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
    assert _severe(browser) == []
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid td.cell")
    assert len(cells) == len(rows)
    assert [c.get_attribute("data-cell") for c in cells] == [REQUIRED, OTHER]
    assert "fail" in cells[1].get_attribute("class").split()

    cells[1].click()
    dialog = browser.find_element(By.ID, "detail")
    assert dialog.get_attribute("open") is not None
    text = dialog.text
    assert "expected an early error" in text
    assert f"nox -s local -- --kvrig-cell {OTHER}" in text
    assert "INFO block size 384 chosen" in text
    assert '"outcome": "ran"' in text
    browser.find_element(By.ID, "close").click()
    assert dialog.get_attribute("open") is None

    # "only rows with a failure" hides the rows that passed.
    browser.find_element(By.ID, "only-fail").click()
    assert not cells[0].is_displayed()
    assert cells[1].is_displayed()
    assert _severe(browser) == []


def _whole_matrix() -> list[dict[str, Any]]:
    """A row for every cell of the shipped matrix on the host's CPU column, one lesser
    class and every emulated device: passing, but each tenth cell failed."""
    from kvrig.define import column_names, gpus
    from kvrig.define.cells import expand
    from kvrig.define.matrix import load

    from ..builders import ROOT

    m = load(ROOT / "matrix.yaml")
    cells = expand(m, "cpu", isa="amx") + expand(m, "cpu", isa="avx2", emulated=True)
    for column in gpus.emulated_columns():
        named = column_names.parse(column)
        assert named is not None
        cells += expand(m, named.platform, gpu_arch=named.gpu_arch, device_emulated=True)
    rows = []
    for i, cell in enumerate(cells):
        runs = cell.expect.outcome == "runs"
        rows.append(
            {
                **cell.identity(),
                "status": "fail" if i % 10 == 3 else "pass",
                "expected": cell.expect.outcome,
                "outcome": "ran" if runs else "error",
                "worker_block_size": 1152 if runs else None,
                "error": None if runs else "NotImplementedError from f: not on this platform",
                "reason": "as expected",
                "gate": cell.case.gate,
            }
        )
    return rows


def test_the_whole_matrix_is_one_picture_that_fits_a_screen(browser: Any, tmp_path: Path) -> None:
    """A release manager's first look: a line per column, a square per cell coloured by its
    verdict, the page's grids no wider than a laptop's screen, each square opening its cell."""
    from selenium.webdriver.common.by import By

    rows = _whole_matrix()
    page = tmp_path / "report.html"
    page.write_text(report.to_html(rows, "the whole matrix"))
    browser.set_window_size(1366, 900)
    browser.get(page.as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
    assert _severe(browser) == []
    width, height = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    squares = browser.find_elements(By.CSS_SELECTOR, "#overview td.sq")
    assert len(squares) == len(rows)
    box = browser.execute_script(
        "var r=document.getElementById('overview').getBoundingClientRect();"
        "return [r.right, r.height]"
    )
    assert box[0] <= width and box[1] <= height, (box, width, height)
    for grid in ("grid", "emulated-grid"):
        right = browser.execute_script(
            f"return document.getElementById('{grid}').getBoundingClientRect().right"
        )
        assert right <= width, (grid, right, width)
    colour = {
        s.get_attribute("data-cell"): s.value_of_css_property("background-color") for s in squares
    }
    failed = next(r["cell_id"] for r in rows if r["status"] == "fail")
    passed = next(r["cell_id"] for r in rows if r["status"] == "pass")
    assert colour[failed] != colour[passed]
    assert len({colour[r["cell_id"]] for r in rows if r["status"] == "pass"}) == 1
    # The lines are the columns, hardware first; a square opens its cell's details.
    labels = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#overview th")]
    assert labels[0] == "cpu (amx)" and labels[-1] == "rocm-gfx1201-emulated"
    next(s for s in squares if s.get_attribute("data-cell") == failed).click()
    assert failed in browser.find_element(By.ID, "detail").text
    assert _severe(browser) == []
