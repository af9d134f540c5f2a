"""No value from the data becomes markup or a link: hostile strings (markup, quotes,
``javascript:`` URLs, template syntax) in every field that reaches a page (algorithm,
dataset, environment names, data source, hparams, run directories, notes, published
sources, OODSelect outputs, table titles) go through the leaderboard site, collect_results
``--format html`` and the analysis tables; every written .html is parsed and must hold
only the site's own elements and attributes, links inside the site (or a published
source's http(s) address), and the hostile text as text."""
import csv
import io
import json
import os
import re
from contextlib import redirect_stdout
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from domainbed.leaderboard import site
from domainbed.leaderboard.published import load_published
from domainbed.scripts import collect_results
from oodutils import tables
from tests.builders import toy_record, write_run

# No "/" in CORE: it also names directories.
CORE = "\"'><svg onload=alert(1)><img src=x onerror=alert(2)>javascript:alert(3){{7*7}}"
SCRIPT = "<script>alert(4)</script>"
ALG = f"alg{CORE}{SCRIPT}"
DATASET = f"ds{CORE}{SCRIPT}"
ENVS = [f"env{i}{CORE}" for i in range(3)]
SOURCE = f"src{CORE}"
HPARAM_KEY, HPARAM_VALUE = f"key{CORE}", f"value{CORE}{SCRIPT}"
RUN_DIR = f"run{CORE}"
OOD_DIR = f"ood{CORE}"
OOD_METHOD = f"method{CORE}{SCRIPT}"
SAFE_URL = "https://example.org/paper?a=1&b=2"
SOURCES = [  # (id, url): a javascript: address must come out as text
    (f"pub{CORE}", "javascript:alert(5)"),
    (f"pub2{CORE}", SAFE_URL),
]

ELEMENTS = {"html", "head", "meta", "title", "link", "body", "header", "h1", "nav", "a",
            "main", "div", "h2", "h3", "ul", "li", "label", "select", "option", "section",
            "p", "table", "caption", "thead", "tbody", "tr", "th", "td", "span", "small",
            "br", "b", "code", "figure", "img", "figcaption", "footer", "script"}
ATTRIBUTES = {"lang", "charset", "name", "content", "rel", "href", "src", "alt", "class",
              "id", "title", "value", "style", "data-sort", "data-col", "data-algorithm",
              "data-method", "data-metric", "selected"}
STYLE = re.compile(r"text-align:(left|right|center)")


class Page(HTMLParser):
    """Elements, attributes, text nodes and script bodies of one HTML file."""

    def __init__(self, path):
        super().__init__(convert_charrefs=True)
        self.elements, self.texts, self.scripts, self._open = [], [], [], []
        self.feed(Path(path).read_text(encoding="utf-8"))
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        self._open.append(tag)

    def handle_endtag(self, tag):
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data):
        (self.scripts if self._open[-1:] == ["script"] else self.texts).append(data)

    def shows(self, value):
        """`value` is a whole text node, or a whole attribute value, or inside one."""
        return any(value in t for t in self.texts) or any(
            value in (v or "") for _, attrs in self.elements for v in attrs.values())


def hostile_sweep(root):
    """Runs of ERM and ALG on DATASET, three environments, two data variants (one with a
    hostile data source), hostile hparams and run directory names."""
    n = 0
    for source in ("a", f"data{CORE}"):
        for alg in ("ERM", ALG):
            for test_env in range(3):
                for trial in range(2):
                    recs = []
                    for step in range(3):
                        accs = {f"env{e}_{s}_acc": 0.5 + 0.1 * ((n + step + e) % 4)
                                for e in range(3) for s in ("in", "out")}
                        rec = toy_record(step, test_envs=(test_env,), trial_seed=trial, **accs)
                        rec["args"].update(dataset=DATASET, algorithm=alg, env_names=ENVS,
                                           data_source=source)
                        rec["hparams"] = {HPARAM_KEY: HPARAM_VALUE, "lr": 0.001}
                        recs.append(rec)
                    write_run(root / f"{RUN_DIR}{n}", recs)
                    n += 1
    return root


def hostile_oodselect(root):
    """An OODSelect output directory: hostile method names and values, dataset name."""
    root.mkdir()
    with open(root / "summary.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["method", "n", "r_test", "r_val"],
                                 [OOD_METHOD, "5", "0.5", CORE]])
    (root / "subsets.json").write_text(json.dumps({"info": {"dataset": DATASET}}))
    return root


def hostile_sources():
    out = []
    for ident, url in SOURCES:
        meta = {"id": ident, "title": f"title{CORE}", "short": f"short{CORE}",
                "citation": f"cite{CORE}", "url": url, "licence": f"licence{CORE}",
                "note": f"note{CORE}", "metric": "acc"}
        rows = [{"method": "training_domain", "table": DATASET, "algorithm": ALG,
                 "column": column, "mean": 50.0, "err": 1.0}
                for column in [*ENVS, "Avg"]]
        rows.append({"method": "training_domain", "table": "Averages", "algorithm": ALG,
                     "column": DATASET, "mean": 50.0, "err": None})
        out.append({"source": meta, "rows": rows})
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The site, collect_results' HTML and an analysis table, all from hostile data."""
    tmp = tmp_path_factory.mktemp("hostile")
    sweep = hostile_sweep(tmp / f"sweep{CORE}")
    ood = hostile_oodselect(tmp / OOD_DIR)
    patch = pytest.MonkeyPatch()
    patch.setattr(site, "load_published", lambda: [*load_published(), *hostile_sources()])
    try:
        model = site.build_site([str(sweep)], str(tmp / "site"), [str(ood)])
    finally:
        patch.undo()
    out = io.StringIO()
    with redirect_stdout(out):
        collect_results.main(["--input_dir", str(sweep), "--format", "html", "--no_save"])
    (tmp / "collect_results.html").write_text(out.getvalue(), encoding="utf-8")
    frame = pd.DataFrame({f"col{CORE}": [ALG, None], "acc": [0.5, float("nan")]})
    tables.write(frame, tmp / "table.html", title=f"title{CORE}{SCRIPT}")
    return tmp, model


def html_files(tmp):
    files = sorted(tmp.rglob("*.html"))
    assert len(files) > 10   # the site's pages, collect_results, the table
    return files


def test_no_element_or_attribute_comes_from_the_data(written):
    tmp, _ = written
    for path in html_files(tmp):
        page = Page(path)
        tags = {tag for tag, _ in page.elements}
        assert tags <= ELEMENTS, (path.name, tags - ELEMENTS)
        for tag, attrs in page.elements:
            assert set(attrs) <= ATTRIBUTES, (path.name, tag, attrs)
            if "style" in attrs:
                assert STYLE.fullmatch(attrs["style"]), (path.name, attrs)
        scripts = [attrs for tag, attrs in page.elements if tag == "script"]
        assert all(s == {"src": "assets/leaderboard.js"} for s in scripts), path.name
        assert not "".join(page.scripts).strip(), path.name     # no inline script
        raw = path.read_text(encoding="utf-8")
        for markup in ("<svg", "<img src=x", SCRIPT, "onload=alert(1)>"):
            assert markup not in raw, (path.name, markup)


def test_links_stay_inside_the_site(written):
    tmp, _ = written
    root = tmp / "site"
    ids = {p.name: {a["id"] for _, a in Page(p).elements if "id" in a}
           for p in root.glob("*.html")}
    external = []
    for path in html_files(tmp):
        for _, attrs in Page(path).elements:
            for name in ("href", "src"):
                if name not in attrs:
                    continue
                url = attrs[name]
                # no scheme but https (no javascript:, data:, file:), no other host
                assert ":" not in url.replace("https://", "", 1), (path.name, url)
                assert not url.startswith("//"), (path.name, url)
                if url.startswith("https://"):
                    external.append(url)
                    continue
                assert path.parent == root, (path.name, url)   # the tables link nowhere
                target, _, anchor = url.partition("#")
                resolved = (root / target).resolve()
                assert resolved.is_file() and root.resolve() in resolved.parents, url
                if anchor:
                    assert anchor in ids[target], (path.name, url)
    # The only address outside the site: the published sources' http(s) ones.
    shipped = {s["source"]["url"] for s in load_published()}
    assert SAFE_URL in external and set(external) <= shipped | {SAFE_URL}
    published = Page(root / "published.html")
    assert published.shows("javascript:alert(5)")                # written as text
    assert not any(a.get("href") == "javascript:alert(5)" for _, a in published.elements)


def test_hostile_text_is_shown_as_text(written):
    tmp, model = written
    root = tmp / "site"
    labels = [d["label"] for d in model["datasets"]]
    assert len(labels) == 2 and any(f"data{CORE}" in label for label in labels)
    index = Page(root / "index.html")
    for value in (ALG, *labels, f"data{CORE}", OOD_METHOD, str(tmp / OOD_DIR)):
        assert index.shows(value), value
    assert any(labels[1] in n and "shown apart" in n for n in model["notes"])
    assert any("shown apart" in t and labels[1] in t for t in index.texts)  # the note
    dataset = Page(root / next(p.name for p in root.glob("dataset_*.html")))
    for value in (ALG, DATASET, *ENVS, f"title{CORE}", f"short{CORE}"):
        assert dataset.shows(value), value
    runs = [Page(p) for p in root.glob("runs_*.html")]
    hparams = json.dumps({HPARAM_KEY: HPARAM_VALUE, "lr": 0.001}, sort_keys=True)
    for value in (ALG, ENVS[1], RUN_DIR, hparams):
        assert any(p.shows(value) for p in runs), value
    published = Page(root / "published.html")
    for value in (f"title{CORE}", f"cite{CORE}", f"note{CORE}", f"licence{CORE}",
                  SOURCES[0][0], f"{DATASET} (training_domain)", SAFE_URL):
        assert published.shows(value), value
    collected = Page(tmp / "collect_results.html")
    for value in (ALG, labels[0], *ENVS):
        assert collected.shows(value), value
    table = Page(tmp / "table.html")
    for value in (f"col{CORE}", ALG, f"title{CORE}{SCRIPT}"):
        assert table.shows(value), value
    # Escaped in the file, not merely dropped.
    assert "&lt;script&gt;alert(4)&lt;/script&gt;" in (root / "index.html").read_text()
    assert os.path.getsize(root / "leaderboard.json") > 0
