"""report.html as a person sees it: rendered in headless Chromium (Selenium), screenshotted, and
checked on the rendered page, not on the HTML string: the verdict is the topmost content, above the
failures, above the per-format tables; its colour says PASS or FAIL; cells are coloured by the
fraction of the bound their row used; the case links point to the case files.

Needs Debian's `chromium` and `chromium-driver` and pip's `selenium`; without them the test skips,
unless TKVERIFY_REQUIRE_BROWSER=1 (CI sets it), where it fails.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from tkverify.policies import Bracket, ErrorBound, bitwise, codes, relative, summation, within
from tkverify.report import GradientRow, ResultRow, meta, write_report

FAILING_CASE, WORST_CASE = "cases/moe.reduce-lib.json", "worst/moe.reduce-lib-out.json"


def _browser():
    """A headless Chromium driven by Selenium; skips (or fails, where a browser is required) without one."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        message = f"no headless browser here (missing: {', '.join(missing)})"
        if os.environ.get("TKVERIFY_REQUIRE_BROWSER") == "1":
            pytest.fail(message + "; TKVERIFY_REQUIRE_BROWSER=1 requires one")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


@pytest.fixture(scope="module")
def browser():
    driver = _browser()
    yield driver
    driver.quit()


def _row(op: str, impl: str, comparison, case: str = "") -> ResultRow:
    """The report row of one comparison, folded as a collector folds it (the verdict derives from the counts)."""
    single = ResultRow.of(op, impl, comparison, case)
    row = single.empty()
    row.fold(single)
    return row


def _rows(failing: bool) -> list[ResultRow]:
    """A small report's rows, from real comparisons: an exact bitwise row, an exhaustive exact codes row, a
    within row that used 3/4 of its bound, a relative row that used half of it, and (if `failing`) a
    summation row past its bound with case files."""
    x = np.array([1.0, 2.0, 3.0])
    exact = _row("quant.cast", "torch", bitwise().compare("out", torch.tensor(x, dtype=torch.float32), x))
    sweep = _row("quant.encode", "tilelang",
                         codes("e4m3", 0).compare("q", torch.tensor(x).to(torch.float8_e4m3fn), x))
    sweep.coverage = "exhaustive"
    near = _row("mhc.pre", "tilelang", within("fp32").compare(
        "comb", torch.tensor([1.75, 2.0, 3.0]), Bracket(x, x - 1, x + 1)))
    inside = _row("moe.mix", "torch", relative(1e-3).compare("w", torch.tensor([1000.5]), np.array([1000.0])))
    rows = [exact, sweep, near, inside]
    if failing:
        bad = _row("moe.reduce", "lib", summation().compare(
            "out", torch.tensor([1.0, 2.0, 3.0 + 2.0**-20]), ErrorBound(x, np.full(3, 2.0**-22), "fp32")), "case 7")
        bad.failing_case, bad.worst_case = FAILING_CASE, WORST_CASE
        rows.append(bad)
    return rows


def _render(tmp_path, failing: bool):
    (tmp_path / "cases").mkdir(parents=True, exist_ok=True)
    (tmp_path / "worst").mkdir(exist_ok=True)
    for path in (FAILING_CASE, WORST_CASE):
        (tmp_path / path).write_text("{}")
    grads = [GradientRow("mhc.pre", "x", "tilelang", "vs_oracle", "ULP", "ulp", cases=2, count=8, exact_count=8,
                         max_error=0.0, max_bound=0.5)]
    return write_report(tmp_path, _rows(failing), meta("ci", "tilelang"), gradients=grads)["html"]


def _rgb(driver, element, prop: str) -> tuple[int, int, int]:
    value = driver.execute_script(f"return getComputedStyle(arguments[0]).{prop}", element)
    r, g, b = (int(float(v)) for v in value[value.index("(") + 1:value.index(")")].split(",")[:3])
    return r, g, b


def _is_red(rgb) -> bool:
    r, g, b = rgb
    return r > g + 60 and r > b + 60


def _is_green(rgb) -> bool:
    r, g, b = rgb
    return g > r + 30 and g > b + 30


def _is_grey(rgb) -> bool:
    return max(rgb) - min(rgb) < 16 and max(rgb) < 250


def _format_cell(driver, fmt: str, label: str, impl: str):
    """The cell of op:output `label` and implementation `impl` in the per-format table of `fmt`."""
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.XPATH, f"//section[@id='formats']/h3[.='{fmt}']/following-sibling::table[1]")
    header = [th.text for th in table.find_elements(By.TAG_NAME, "th")]
    row = table.find_element(By.XPATH, f".//tr[td[1][.='{label}']]")
    return row.find_elements(By.TAG_NAME, "td")[header.index(impl)]


def _open(driver, page, shot):
    driver.get(page.as_uri())
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(height, 600), 4000))
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000  # a drawn page, not a blank one


def test_a_failing_report_leads_with_a_red_verdict_then_the_failures_then_the_tables(browser, tmp_path):
    from selenium.webdriver.common.by import By

    page = _render(tmp_path, failing=True)
    _open(browser, page, tmp_path / "report-fail.png")
    verdict = browser.find_element(By.ID, "verdict")
    failures = browser.find_element(By.ID, "failures")
    first_table = browser.find_element(By.CSS_SELECTOR, "#formats table.formats")
    assert verdict.is_displayed() and "FAIL" in verdict.text and "4 of 5 rows pass" in verdict.text
    assert verdict.location["y"] < failures.location["y"] < first_table.location["y"]
    # Nothing shown is above the verdict.
    for element in browser.find_elements(By.XPATH, "//body/*"):
        if element.is_displayed() and element != verdict:
            assert element.location["y"] >= verdict.location["y"] + verdict.size["height"] - 1, element.tag_name
    assert _is_red(_rgb(browser, verdict, "backgroundColor"))
    assert _is_red(_rgb(browser, _format_cell(browser, "fp32", "moe.reduce:out", "lib"), "backgroundColor"))
    exact = _rgb(browser, _format_cell(browser, "fp32", "quant.cast:out", "torch"), "backgroundColor")
    assert _is_grey(exact) or _is_green(exact), exact
    # The failing row names its bound and the fraction used, and links its case files.
    assert "within the fp32 summation error bound" in failures.text and "2 " in failures.text
    links = {a.text: a.get_attribute("href") for a in failures.find_elements(By.TAG_NAME, "a")}
    assert links == {"failing case": (tmp_path / FAILING_CASE).as_uri(), "worst case": (tmp_path / WORST_CASE).as_uri()}
    assert all((tmp_path / path).is_file() for path in (FAILING_CASE, WORST_CASE))


def test_a_passing_report_shows_a_green_verdict_and_colours_rows_by_their_bound(browser, tmp_path):
    from selenium.webdriver.common.by import By

    page = _render(tmp_path, failing=False)
    _open(browser, page, tmp_path / "report-pass.png")
    verdict = browser.find_element(By.ID, "verdict")
    assert verdict.is_displayed() and "PASS" in verdict.text and "4 of 4 rows pass" in verdict.text
    assert "1 of 1 gradient rows pass" in verdict.text
    assert _is_green(_rgb(browser, verdict, "backgroundColor"))
    assert not browser.find_elements(By.ID, "failures")
    assert verdict.location["y"] < browser.find_element(By.CSS_SELECTOR, "#formats table.formats").location["y"]
    # Judged by the bound: exact grey, half of the bound green, 3/4 of it amber; the exhaustive row says so.
    assert _is_grey(_rgb(browser, _format_cell(browser, "fp32", "quant.cast:out", "torch"), "backgroundColor"))
    near = _format_cell(browser, "fp32", "mhc.pre:comb", "tilelang")
    r, g, b = _rgb(browser, near, "backgroundColor")
    assert near.text == "0.75 of bound" and r > b + 60 and g > b + 40, (r, g, b)  # amber
    inside = _format_cell(browser, "fp32", "moe.mix:w", "torch")
    assert inside.text == "0.5 of bound" and _is_green(_rgb(browser, inside, "backgroundColor"))
    sweep = _format_cell(browser, "e4m3", "quant.encode:q", "tilelang")
    assert sweep.text == "0 (exhaustive)" and _is_grey(_rgb(browser, sweep, "backgroundColor"))
