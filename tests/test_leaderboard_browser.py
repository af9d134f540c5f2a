"""The leaderboard in a real headless Chromium (Selenium, Debian's chromium and
chromium-driver): tables render with the numbers of leaderboard.json, sorting a column
reorders the rows, the filters hide what they should, and a screenshot is saved."""
import io
import json
from contextlib import redirect_stdout

import pytest

from domainbed.scripts import leaderboard as cli
from tests.requirements import data_dir, need_browser, need_data

SWEEP = data_dir("domainbed_test_sweep") / "test_sweep_data"


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.binary_location = chromium
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("site")
    sweep = need_data(SWEEP, "DomainBed's test sweep")
    out = tmp / "site"
    with redirect_stdout(io.StringIO()):
        cli.main(["--input_dir", str(sweep), "--out", str(out), "--selection_methods",
                  "training_domain", "oracle"])
    return out, json.loads((out / "leaderboard.json").read_text())


def rows_of(driver, method):
    from selenium.webdriver.common.by import By
    table = driver.find_element(By.CSS_SELECTOR,
                                f'section[data-method="{method}"] table.board')
    return table, table.find_elements(By.CSS_SELECTOR, "tbody tr")


def first_cells(rows):
    from selenium.webdriver.common.by import By
    return [r.find_elements(By.TAG_NAME, "td")[0].get_attribute("data-sort") for r in rows]


def test_site_in_headless_chromium(browser, site, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    out, model = site
    section = model["sections"][0]
    table = section["tables"][0]
    dataset = table["dataset"]

    # Overview: the rendered cells are the numbers of leaderboard.json.
    browser.get((out / "index.html").as_uri())
    _, rows = rows_of(browser, "training_domain")
    user = rows[0].find_elements(By.TAG_NAME, "td")
    want = section["overview"]["rows"][0]
    assert user[0].text == want["algorithm"]
    assert user[1].text.startswith(want["cells"][0]["text"])
    assert user[2].text == want["avg_text"]
    assert "best" in user[2].get_attribute("class")

    # The title names the sweep and the build date.
    assert browser.title == f"Leaderboard of {model['sweeps'][0]}, built {model['built']}"

    # Dataset page: every user cell as in the JSON, the published rows beside them.
    browser.get((out / f"dataset_{dataset}.html").as_uri())
    assert browser.title == f"Leaderboard of {model['sweeps'][0]}: {dataset}"
    tbl, rows = rows_of(browser, "training_domain")
    shown = [td.text.split("\n")[0] for td in rows[0].find_elements(By.TAG_NAME, "td")[1:]]
    assert shown == [c["text"] for c in table["rows"][0]["cells"]] + \
        [table["rows"][0]["avg_text"]]
    n_published = len(table["published"])
    assert len(rows) == len(table["rows"]) + n_published
    assert len(tbl.find_elements(By.CSS_SELECTOR, "tr.published .badge")) == n_published

    # Sorting: a click on the second environment sorts descending, missing cells last.
    def values(col):
        _, rs = rows_of(browser, "training_domain")
        raw = [r.find_elements(By.TAG_NAME, "td")[col].get_attribute("data-sort") for r in rs]
        return [float(v) if v else None for v in raw], first_cells(rs)

    before_values, before_names = values(2)
    tbl.find_elements(By.CSS_SELECTOR, "th.sortable")[2].click()
    after_values, after_names = values(2)
    present = [v for v in after_values if v is not None]
    assert present == sorted(present, reverse=True)
    assert after_values[:len(present)] == present          # missing cells go last
    assert sorted(before_values, key=str) == sorted(after_values, key=str)
    if n_published:
        assert after_names != before_names                 # the rows really moved
    tbl.find_elements(By.CSS_SELECTOR, "th.sortable")[2].click()
    asc = [v for v in values(2)[0] if v is not None]
    assert asc == sorted(asc)

    # Filters: one algorithm; one selection method.
    algorithms = [o.get_attribute("value") for o in
                  Select(browser.find_element(By.ID, "algorithm-filter")).options][1:]
    pick = "IRM" if "IRM" in algorithms else algorithms[0]
    Select(browser.find_element(By.ID, "algorithm-filter")).select_by_value(pick)
    _, rows = rows_of(browser, "training_domain")
    visible = [r.get_attribute("data-algorithm") for r in rows if r.is_displayed()]
    assert visible and set(visible) == {pick}
    Select(browser.find_element(By.ID, "algorithm-filter")).select_by_value("")
    Select(browser.find_element(By.ID, "method-filter")).select_by_value("oracle")
    sections = browser.find_elements(By.CSS_SELECTOR, "section.method")
    shown = {s.get_attribute("data-method") for s in sections if s.is_displayed()}
    assert shown == {"oracle"}

    # Each cell links to the runs behind it.
    Select(browser.find_element(By.ID, "method-filter")).select_by_value("")
    link = browser.find_element(By.CSS_SELECTOR,
                                'section[data-method="training_domain"] td.best a')
    link.click()
    assert "runs_" in browser.current_url and browser.find_element(
        By.CSS_SELECTOR, "table.runs code").text

    browser.get((out / "index.html").as_uri())
    shot = tmp_path / "leaderboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_no_page_is_wider_than_a_1280_px_screen(browser, site):
    """Every page fits a 1280 px window: no table pushes the page into sideways scrolling."""
    out, _ = site
    browser.set_window_size(1280, 1000)
    width = browser.execute_script("return window.innerWidth")
    assert width <= 1280
    pages = sorted(out.glob("*.html"))
    assert any(p.name.startswith("dataset_") for p in pages)
    for page in pages:
        browser.get(page.as_uri())
        scroll = browser.execute_script("return document.documentElement.scrollWidth")
        assert scroll <= width, f"{page.name} is {scroll} px wide in a {width} px window"


@pytest.fixture(scope="module")
def metric_site(tmp_path_factory):
    from tests.test_leaderboard_metrics import build, write_runs
    tmp = tmp_path_factory.mktemp("metric_site")
    write_runs(tmp / "sweep", side_file_for={("IRM", 1)})
    build(tmp / "sweep", tmp / "site")
    return tmp / "site"


def test_the_metric_selector_shows_that_metrics_numbers(browser, metric_site):
    """Selecting a metric shows only its tables, with the numbers of the records' last
    checkpoints (oracle selection), the lowest nll and ece marked best."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.test_leaderboard_metrics import expected_oracle_text
    browser.get((metric_site / "dataset_Debug28.html").as_uri())
    metric = Select(browser.find_element(By.ID, "metric-filter"))
    assert [o.get_attribute("value") for o in metric.options] == ["accuracy", "nll", "ece"]

    def shown():
        sections = browser.find_elements(By.CSS_SELECTOR, "section.method")
        return {(s.get_attribute("data-method"), s.get_attribute("data-metric"))
                for s in sections if s.is_displayed()}

    def oracle_cells(name):
        table = browser.find_element(
            By.CSS_SELECTOR, f'section[data-method="oracle"][data-metric="{name}"] table.board')
        return {r.get_attribute("data-algorithm"): [
            (td.text.split("\n")[0], "best" in (td.get_attribute("class") or ""))
            for td in r.find_elements(By.TAG_NAME, "td")[1:3]]
            for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")}

    assert shown() == {("training_domain", "accuracy"), ("oracle", "accuracy")}
    for name in ("nll", "ece", "accuracy"):
        metric.select_by_value(name)
        assert shown() == {("training_domain", name), ("oracle", name)}
        cells = oracle_cells(name)
        for algorithm in ("ERM", "IRM"):
            assert [text for text, _ in cells[algorithm]] == [
                expected_oracle_text(algorithm, env, name) for env in (0, 1)]
        for env in (0, 1):
            values = {a: float(expected_oracle_text(a, env, name)) for a in ("ERM", "IRM")}
            best = (max if name == "accuracy" else min)(values, key=values.get)
            assert [a for a in cells if cells[a][env][1]] == [best]

    browser.get((metric_site / "index.html").as_uri())
    Select(browser.find_element(By.ID, "metric-filter")).select_by_value("nll")
    Select(browser.find_element(By.ID, "method-filter")).select_by_value("oracle")
    assert shown() == {("oracle", "nll")}
