"""The documentation site: every code block in docs/ runs (as README blocks do, with the
same directives and block parser), and `mkdocs build --strict` passes."""
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.test_readme import (
    REPO,
    RUN_LANGUAGES,
    reader_environment,
    readme_blocks,
    run_block,
)


def _nav_pages(nav):
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


def _mkdocs_config():
    class Loader(yaml.SafeLoader):   # mkdocs.yml may use !!python/name tags; none needed here
        pass
    return yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)


def doc_pages():
    """The docs' Markdown pages in the site's reading order (mkdocs.yml's nav), then
    CONTRIBUTING.md."""
    pages = [REPO / "docs" / p for p in _nav_pages(_mkdocs_config()["nav"])]
    return pages + [REPO / "CONTRIBUTING.md"]


def doc_blocks():
    blocks = []
    for page in doc_pages():
        if page.exists():   # generated reference pages hold no runnable blocks
            blocks += readme_blocks(page.read_text(), source=str(page.relative_to(REPO)))
    return blocks


def test_every_nav_page_exists_or_is_generated():
    generated = {"commands.md", "algorithms.md", "datasets.md"}
    missing = [p for p in doc_pages() if not p.exists() and p.name not in generated]
    assert missing == []


def test_docs_blocks_parse_and_some_run():
    blocks = doc_blocks()
    runnable = [b for b in blocks if b.language in RUN_LANGUAGES and b.skip is None]
    assert len(runnable) >= 5, "did the fence or directive syntax change?"
    assert all(b.source.endswith(".md") for b in blocks)


@pytest.mark.slow
def test_docs_code_blocks_run(tmp_path):
    """Every runnable block of every page, in reading order, in one folder."""
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    (cwd / "scripts").symlink_to(REPO / "scripts")
    env = reader_environment(tmp_path)
    for block in doc_blocks():
        if block.language in RUN_LANGUAGES and block.skip is None:
            run_block(block, cwd, env)


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "commands" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in ("domainbed.results.records.load_records", "domainbed.training.config.RunConfig"):
        assert f'<h2 id="{name}"' in api, name   # its own heading, not train_zoo's text


def test_benchmarks_page_is_what_the_recorded_figures_render(tmp_path):
    """docs/benchmarks.md is rendered from docs/benchmarks/*.json (what the benchmark
    scripts recorded), never edited by hand; a new figure appears as a row."""
    sys.path.insert(0, str(REPO / "scripts"))
    import benchfigures
    import gen_docs
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert page == gen_docs.benchmarks_page() + "\n", "run python scripts/gen_docs.py"
    benchfigures.record("test-figure", what="A test figure", headline="42 s",
                        peer="DomainBed 84 s", command="true",
                        result="42 s wall, 40 s CPU (median of 3)", figures=tmp_path)
    rendered = gen_docs.benchmarks_page(tmp_path)
    row = re.compile(r"^\| \[A test figure\]\(benchmarks/test-figure\.json\) \| 42 s"
                     r"( \(loaded\))? \| DomainBed 84 s \| `true` \|$", re.M)   # loaded: now
    assert row.search(rendered), rendered
    assert "40 s CPU" not in rendered   # the details stay in the record
    with pytest.raises(ValueError):
        benchfigures.record("../escape", what="x", headline="x", peer="x", command="x",
                            result="x", figures=tmp_path)
    with pytest.raises(ValueError, match="headline"):   # one short row per figure
        benchfigures.record("long", what="x", headline="a paragraph " * 10, peer="x",
                            command="x", result="x", figures=tmp_path)


def _gen_docs():
    sys.path.insert(0, str(REPO / "scripts"))
    import gen_docs
    return gen_docs


def test_every_generated_usage_line_names_its_command(monkeypatch):
    """Under MkDocs (sys.argv[0] is `mkdocs`) each command's section shows its own usage
    (issue 43, item 4)."""
    import re
    monkeypatch.setattr(sys, "argv", ["mkdocs", "build"])
    page = _gen_docs().commands_page()
    sections = re.split(r"^## `([^`]+)`$", page, flags=re.M)[1:]
    usages = {command: re.search(r"^usage: (\S+)", text, flags=re.M).group(1)
              for command, text in zip(sections[::2], sections[1::2])}
    assert len(usages) == len(_gen_docs().console_commands())
    assert {c: u for c, u in usages.items() if u != c} == {}


def test_api_objects_get_headings_and_long_lines_wrap():
    """Every object on the API page has its own heading (so load_records' docstring does not
    read as train_zoo's), and code blocks wrap instead of scrolling sideways."""
    api = (REPO / "docs" / "reference" / "api.md").read_text()
    blocks = api.split(":::")[1:]
    assert len(blocks) >= 3 and all("show_root_heading: true" in b for b in blocks)
    css = [REPO / "docs" / path for path in _mkdocs_config().get("extra_css", [])]
    assert css and any("white-space: pre-wrap" in path.read_text() for path in css)


def test_docs_build_leaves_the_tours_site_alone(tmp_path):
    """The docs go to their own folder, not `site` (the tour's leaderboard), and the build
    refuses to clean a folder that another command wrote (issue 43, item 2)."""
    site_dir = _mkdocs_config()["site_dir"]
    assert site_dir not in ("site", "sweeps", "runs", "data")
    gen_docs = _gen_docs()
    board = tmp_path / "site"
    board.mkdir()
    (board / "leaderboard.json").write_text("{}")
    assert "leaderboard.json" in gen_docs.foreign_site_dir(board)
    from mkdocs.exceptions import PluginError
    with pytest.raises(PluginError, match="no docs build wrote"):
        gen_docs.on_pre_build({"site_dir": str(board)})
    assert (board / "leaderboard.json").exists()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "sitemap.xml").write_text("")
    assert gen_docs.foreign_site_dir(tmp_path / "docs") is None
    assert gen_docs.foreign_site_dir(tmp_path / "absent") is None


def test_every_output_folder_of_the_tour_is_ignored_by_git():
    """The folders the README's tour, the quickstart and the docs build write are all
    ignored by git, none left to show up as untracked work."""
    ignored = set((REPO / ".gitignore").read_text().split())
    site_dir = _mkdocs_config()["site_dir"]
    for folder in ("runs", "sweeps", "site", "data", site_dir):
        assert f"/{folder}/" in ignored, folder
    readme = (REPO / "README.md").read_text()
    for folder in ("runs/", "sweeps/", "--output_dir site", "--data_dir data"):
        assert folder in readme, folder   # what the tour writes, so the list above is true


def test_the_quickstart_prints_the_site_path_once(tmp_path, monkeypatch, capsys):
    """The leaderboard command prints where its site is; the quickstart does not repeat
    it (issue 43, item 6). The commands are stood in for: their argv is what counts."""
    sys.path.insert(0, str(REPO / "scripts"))
    import quickstart
    calls = []

    def call(argv):
        calls.append(argv)
        if "domainbed.scripts.leaderboard" in argv:
            site = argv[argv.index("--output_dir") + 1]
            print(f"leaderboard: {os.path.abspath(site)}/index.html (1 records, 1 datasets)")
        return 0
    monkeypatch.setattr(quickstart.subprocess, "call", call)
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "--data_dir", str(tmp_path / "data"),
                                      "--output_dir", str(tmp_path / "sweep")])
    with pytest.raises(SystemExit):
        quickstart.main()
    out = capsys.readouterr().out
    assert len(calls) == 3 and out.count("index.html") == 1, out
