"""oodutils, the shared helpers: one table renderer in five formats with one LaTeX escaper,
one probit with named clips, one accuracy check, one --hparams parser; spawrious and
ood_bench take their generic helpers from it, not from domainbed."""
import ast
import importlib
import importlib.util
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import ndtri

from oodutils import accuracy, tables
from oodutils.cli import parse_json_object
from oodutils.csv_out import csv_text
from oodutils.errors import UnknownNameError, UserError
from tests.requirements import need_package

ROOT = Path(__file__).resolve().parents[1]


# --- tables ---------------------------------------------------------------------------

@pytest.fixture
def frame():
    return pd.DataFrame({"name": ["a_b", "c|d", "x&<y>"], "acc": [0.12345, -0.0001, np.nan],
                         "ok": [True, False, True]})


def test_text(frame):
    text = tables.render(frame, "text", digits=3, title="T")
    assert text.splitlines() == ["T",
                                 "name     acc  ok",
                                 "-----  -----  ---",
                                 "a_b    0.123  yes",
                                 "c|d    0.000  no",       # no "-0.000"
                                 "x&<y>      -  yes"]      # NaN is "-"; numbers right-aligned


def test_markdown(frame):
    lines = tables.render(frame, "markdown").splitlines()
    assert lines[0] == "| name | acc | ok |"
    assert lines[1] == "|:---|---:|:---|"
    assert lines[3] == "| c\\|d | 0.00 | no |"


def test_latex_and_its_one_escaper(frame):
    tex = tables.render(frame, "latex", title="50% of a_b")
    assert r"\caption{50\% of a\_b}" in tex and r"\begin{tabular}{lrl}" in tex
    assert r"a\_b & 0.12 & yes \\" in tex and r"x\&<y> & - & yes \\" in tex
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert tables.latex_escape("~^\\{}#$%&_") == (
        r"\textasciitilde{}\textasciicircum{}\textbackslash{}\{\}\#\$\%\&\_")
    # every package uses this one escaper
    from domainbed.results import tables as reporting
    assert reporting.latex_escape is tables.latex_escape


REMOVED = ("domainbed.errors", "domainbed.fileio", "analysis.report")


@pytest.mark.parametrize("old", REMOVED)
def test_moved_modules_have_no_shim(old):
    """No module stays behind under an old name before a first release."""
    assert importlib.util.find_spec(old) is None, f"{old} is back: import from oodutils"


def test_no_deprecation_shims_or_old_names():
    """No library module warns of its own deprecation or re-exports names under an old
    name or path; each name is imported from the module that defines it."""
    shims = []
    for package in ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if re.search(r"DeprecationWarning|old (name|path|home)\b", text):
                shims.append(str(path.relative_to(ROOT)))
    assert shims == []
    reexports = [f"{path.relative_to(ROOT)}:{number}"
                 for package in ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
                 for path in sorted((ROOT / package).rglob("*.py")) if path.name != "__init__.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if line.startswith("from ") and "noqa: F401" in line]
    assert reexports == [], "a module re-exports names it does not use"
    launchers = importlib.import_module("domainbed.launch.launchers")
    assert not hasattr(launchers, "job_state") and not hasattr(launchers, "_try_lock")


def test_csv_keeps_full_precision(frame):
    back = pd.read_csv(io.StringIO(tables.render(frame, "csv")))
    assert list(back.columns) == ["name", "acc", "ok"]
    assert back["acc"][0] == 0.12345 and math.isnan(back["acc"][2])
    assert csv_text(["a", "b"], [["x,y", 1]]) == 'a,b\n"x,y",1\n'


def test_html_escapes(frame):
    html = tables.render(frame, "html", title="<T>")
    assert "<caption>&lt;T&gt;</caption>" in html and "<th>name</th>" in html
    assert '<td style="text-align:left">x&amp;&lt;y&gt;</td>' in html
    assert '<td style="text-align:right">0.12</td>' in html


def test_link_rules_keep_pages_inside_the_site():
    from oodutils.templating import site_href, source_href
    inside = ["index.html", "dataset_VLCS.html#cell-ERM-e1", "img/aotl_x_env0.png",
              "#notes", "assets/style.css"]
    outside = ["javascript:alert(1)", "JavaScript:alert(1)", " javascript:x", "//evil.org/x",
               "../secret.html", "img/../../x.png", ".hidden", "data:text/html,<b>",
               "file:///etc/passwd", "a.html?x=1", "a b.html", "", None, 3]
    published = ["https://github.com/facebookresearch/DomainBed", "http://x.org/a?b=1&c=2"]
    bad_published = ["https:/no-host", "https://x.org/\"onmouseover=alert(1)",
                     "https://x.org/<script>", "vbscript:msgbox", "ftp://x.org/f"]
    assert [site_href(u) for u in inside] == inside
    assert [site_href(u) for u in outside + published] == [None] * 16
    assert [source_href(u) for u in inside + published] == inside + published
    assert [source_href(u) for u in outside + bad_published] == [None] * 19


def test_unknown_format_and_paths(frame, tmp_path):
    with pytest.raises(UnknownNameError, match="valid formats: csv, html, latex"):
        tables.render(frame, "docx")
    assert tables.format_for_path("x/t.TEX") == "latex"
    path = tables.write(frame, tmp_path / "t.md")
    assert path.read_text() == tables.render(frame, "markdown")


def test_domainbed_report_in_all_five_formats():
    from domainbed.results import tables as R
    cell = R.Cell(12.345, 1.25, 3)
    table = R.Table(title="Dataset: D_1, model selection method: m", heading="D_1",
                    columns=["e0", "e1"], rows=["ERM", "A|B"], cells=[[cell, None], [cell, cell]],
                    avg=[None, 12.345], colwidth=10, env_indices=[0, 1])
    report = R.Report(5, [R.Section("m & n", [table])])
    text = R.render(report, "text")
    # DomainBed's layout: one uniform column width, two spaces apart, a trailing space
    assert text.splitlines()[2:] == ["-------- Dataset: D_1, model selection method: m",
                                     "Algorithm     e0            e1            Avg" + " " * 10,
                                     "ERM           12.3 +/- 1.2  X             X" + " " * 12,
                                     "A|B           12.3 +/- 1.2  12.3 +/- 1.2  12.3" + " " * 9]
    md = R.render(report, "markdown")
    assert "|---|:---:|:---:|:---:|" in md and "| A\\|B | 12.3 ± 1.2 |" in md
    tex = R.render(report, "latex")
    assert r"\subsection{Model selection: m \& n}" in tex and r"\end{tabular}}" in tex
    assert r"\textbf{Algorithm} & \textbf{e0}" in tex and r"12.3 $\pm$ 1.2" in tex
    csv = pd.read_csv(io.StringIO(R.render(report, "csv")))
    assert len(csv) == 6 and csv["mean"].iloc[0] == 12.345
    html = R.render(report, "html")
    assert "<h2>Model selection: m &amp; n</h2>" in html and "<td>" not in html
    assert '<td style="text-align:center">12.3 ± 1.2</td>' in html
    with pytest.raises(UserError):
        R.render(report, "docx")


# --- probit and accuracies ------------------------------------------------------------

def test_probit_clips_are_named_and_used():
    assert accuracy.probit(0.0) == pytest.approx(ndtri(accuracy.AOTL_CLIP))
    assert accuracy.probit(1.0, accuracy.OODSELECT_CLIP) == pytest.approx(ndtri(1 - 1e-6))
    assert accuracy.probit([0.0, 1.0], clip=0).tolist() == [-math.inf, math.inf]
    assert accuracy.probit(0.3, clip=0.4) == pytest.approx(ndtri(0.4))
    with pytest.raises(UserError, match=r"--clip must lie in \[0, 0.5\)"):
        accuracy.probit(0.5, clip=0.5)
    # each caller keeps its own clip
    from analysis import aotl, oodselect, theory
    assert aotl.probit(0.0) == pytest.approx(ndtri(0.01))
    assert oodselect.probit(0.0) == pytest.approx(ndtri(1e-6))
    assert aotl.transform([0.0], "probit", 0.05)[0] == pytest.approx(ndtri(0.05))
    fit = theory.probit_fit([0.0, 0.5, 0.9, 1.0], [0.1, 0.5, 0.8, 1.0])
    tx = ndtri(np.clip([0.0, 0.5, 0.9, 1.0], 1e-6, 1 - 1e-6))
    ty = ndtri(np.clip([0.1, 0.5, 0.8, 1.0], 1e-6, 1 - 1e-6))
    assert fit["slope"] == pytest.approx(np.polyfit(tx, ty, 1)[0])


def test_probit_on_tensors_matches_numpy():
    torch = need_package("torch")
    a = np.array([0.0, 1e-3, 0.3, 0.5, 0.97, 1.0])
    t = accuracy.probit(torch.tensor(a, dtype=torch.float64), accuracy.OODSELECT_CLIP)
    assert torch.is_tensor(t) and t.dtype == torch.float64
    np.testing.assert_allclose(t.numpy(), accuracy.probit(a, accuracy.OODSELECT_CLIP),
                               rtol=1e-9)


@pytest.mark.parametrize("values, kwargs, message", [
    ([0.2, 70.0], {}, r"fractions in \[0, 1\].*\[0.2, 70\].*percentages: divide by 100"),
    ([0.2, -0.1], {}, r"found values in \[-0.1, 0.2\]$"),
    ([0.2, np.inf], {}, r"\[0, 1\]"),
    ([0.2, np.nan], {}, "1 accuracies are missing"),
    ([np.nan], {"allow_nan": True}, "all accuracies are missing"),
    ([], {}, "no accs given"),
    (["x"], {}, "must be numbers"),
])
def test_check_accuracies_errors(values, kwargs, message):
    with pytest.raises(UserError, match=message):
        accuracy.check_accuracies(values, "accs", **kwargs)


def test_check_accuracies_accepts():
    assert accuracy.check_accuracies([0, 0.5, 1]).dtype == np.float64
    assert accuracy.check_accuracies([], allow_empty=True).size == 0
    assert np.isnan(accuracy.check_accuracies([0.5, np.nan], allow_nan=True)[1])


# --- the --hparams parser --------------------------------------------------------------

def test_parse_json_object():
    assert parse_json_object(None) == {} and parse_json_object("  ") == {}
    assert parse_json_object('{"lr": 0.1}') == {"lr": 0.1}
    with pytest.raises(UserError, match=r"^--hparams is not valid JSON \(.*\): '\{bad'$"):
        parse_json_object("{bad")
    with pytest.raises(UserError, match="^--dataset-settings must be a JSON object.*got list"):
        parse_json_object("[1]", "--dataset-settings")


@pytest.mark.parametrize("module, argv", [
    ("domainbed.scripts.train", ["--dataset", "ColoredMNIST", "--data_dir", ".",
                                 "--hparams", "{bad"]),
    ("ood_bench", ["extract", "--dataset", "ColoredMNIST", "--data-dir", ".", "--envs-p",
                   "0", "--envs-q", "1", "--out", "f.npz", "--dataset-settings", "[1]"]),
])
def test_bad_json_option_is_one_error_line(tmp_path, module, argv):
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=tmp_path,
                          capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "JSON" in lines[0], lines


# --- package boundaries ----------------------------------------------------------------

GENERIC = ("domainbed.results.tables",)


def generic_imports(package):
    """(file, module) for every import of a generic helper from another package."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [(path.name, n) for n in names if n in GENERIC]
    return found


@pytest.mark.parametrize("package", ["spawrious", "ood_bench", "analysis"])
def test_generic_helpers_come_from_oodutils(package):
    assert generic_imports(package) == []


def test_oodutils_stands_alone():
    code = ("import sys, oodutils.errors, oodutils.fileio, oodutils.tables, oodutils.accuracy, "
            "oodutils.cli, oodutils.log, spawrious.generate, spawrious.splits, ood_bench.cli, "
            "ood_bench.quantify; print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'domainbed')))")
    proc = subprocess.run([sys.executable, "-c", "import json; " + code], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == []


# ------------------------------------------------------------ hostile text from records
def test_csv_escapes_formula_leading_text_but_not_numbers():
    text = csv_text(["algorithm", "mean"],
                           [["=HYPERLINK(\"http://x\")", "-0.5"], ["@SUM(A1)", "+1"],
                            ["-cmd|' /c calc'!A0", -2.0], ["+x", "12"], ["ERM", "3"]])
    back = pd.read_csv(io.StringIO(text), dtype=str)
    assert list(back["algorithm"]) == ["'=HYPERLINK(\"http://x\")", "'@SUM(A1)",
                                       "'-cmd|' /c calc'!A0", "'+x", "ERM"]
    assert list(back["mean"]) == ["-0.5", "+1", "-2.0", "12", "3"]
    frame = pd.DataFrame({"dataset": ["=1+2", "ok"], "acc": [-1.5, 2.0]})
    back = pd.read_csv(io.StringIO(tables.render(frame, "csv")))
    assert list(back["dataset"]) == ["'=1+2", "ok"] and list(back["acc"]) == [-1.5, 2.0]


def test_markdown_and_latex_make_record_text_inert():
    frame = pd.DataFrame({"algorithm": ["<script>alert(1)</script>", "a\n\nb"],
                          "tex": [r"\input{/etc/passwd}", r"\write18{rm -rf x}"]})
    md = tables.render(frame, "markdown", title="<b>t</b>")
    assert "<" not in md and ">" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "**&lt;b&gt;t&lt;/b&gt;**" in md
    assert len(md.splitlines()) == 6   # title, blank, header, rule, two rows
    tex = tables.render(frame, "latex")
    assert r"\input" not in tex and r"\write18" not in tex
    assert r"\textbackslash{}input\{/etc/passwd\}" in tex
    assert "a  b &" in tex   # no blank line inside the table


def test_load_errors_never_advise_unsafe_loading(tmp_path):
    import numpy as np
    import torch

    from oodutils.errors import load_error_reason

    class Evil:
        def __reduce__(self):
            return (print, ("x",))
    torch.save({"a": Evil()}, tmp_path / "evil.pt")
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object))
    errors = []
    for load in (lambda: torch.load(tmp_path / "evil.pt", weights_only=True),
                 lambda: np.load(tmp_path / "evil.npy", allow_pickle=False)):
        with pytest.raises(Exception) as info:
            load()
        errors.append(info.value)
    assert "weights_only" in str(errors[0]) and "allow_pickle" in str(errors[1])  # theirs
    for error in errors:
        reason = load_error_reason(error)
        assert "weights_only" not in reason and "allow_pickle" not in reason
        assert "could run code" in reason and "\n" not in reason
    # the global as torch names it: "print" (newer torch) or "builtins.print" (torch 2.4)
    assert re.search(r"\((builtins\.)?print\)", load_error_reason(errors[0]))
    assert load_error_reason(ValueError("truncated\nmore")) == "truncated"


def test_npz_at_a_zlib_level_reads_back_as_numpys_own():
    """npz_bytes(level=1) (checkpoint predictions): the arrays np.savez_compressed keeps,
    dtypes and shapes too, read by np.load."""
    from oodutils import fileio
    arrays = {"pred": np.arange(500) % 3, "correct": np.ones(500, np.uint8),
              "logits": np.linspace(-2, 2, 1000, dtype=np.float16).reshape(500, 2)}
    fast = np.load(io.BytesIO(fileio.npz_bytes(level=1, **arrays)))
    numpys = np.load(io.BytesIO(fileio.npz_bytes(**arrays)))
    assert sorted(fast.files) == sorted(numpys.files) == sorted(arrays)
    for name, array in arrays.items():
        assert fast[name].dtype == array.dtype and np.array_equal(fast[name], numpys[name])


def test_read_head_stat_reads_a_small_file_whole_and_caps_a_large_one(tmp_path):
    import os

    import pytest

    from oodutils.untrusted import NotRegularFile, read_head_stat
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"x" * 1000)
    large.write_bytes(b"y" * 5000)
    data, st = read_head_stat(small, 4096)
    assert data == b"x" * 1000 and st.st_size == 1000 and st.st_ino == os.stat(small).st_ino
    data, st = read_head_stat(large, 4096)
    assert data == b"y" * 4097 and st.st_size == 5000     # one byte past the cap: too large
    (tmp_path / "empty").write_bytes(b"")
    assert read_head_stat(tmp_path / "empty", 4096)[0] == b""
    (tmp_path / "link").symlink_to(small)
    with pytest.raises(NotRegularFile):
        read_head_stat(tmp_path / "link", 4096)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotRegularFile):
        read_head_stat(tmp_path / "fifo", 4096)             # never blocks on a FIFO
