"""Users know papers by authors, year and title, not by the project's internal source numbers
("seed" plus three digits): no docstring, help text, README passage or data citation may name a
paper that way (issue 23, item 6)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED_FOLDERS = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils", "tests", "docs",
                   "scripts")
SCANNED_SUFFIXES = {".py", ".md", ".toml", ".json", ".html", ".sh"}
# "seed" / "seeds" + space or underscore + 00N; a random seed such as "seed 0" does not match.
SOURCE_NUMBER = re.compile(r"\bseeds?[ _]00\d\b", re.IGNORECASE)


def scanned_files():
    yield from (p for p in ROOT.iterdir() if p.is_file() and p.suffix in SCANNED_SUFFIXES)
    for folder in SCANNED_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in SCANNED_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def test_pattern_tells_source_numbers_from_random_seeds():
    # built from pieces, so this file does not itself hold a source number
    for text in ("seed 0" "00's theory", "Seed 0" "02's K", "(seed 0" "04; Table 12)",
                 "seeds 0" "01", "seed_0" "03"):
        assert SOURCE_NUMBER.search(text), text
    for text in ("seed 0 gives defaults", "trial seed 0", "hparams_seed=0", "seed 42", "seed 0010"):
        assert not SOURCE_NUMBER.search(text), text


def test_no_paper_is_named_by_its_source_number():
    files = list(scanned_files())
    assert any(p.name == "README.md" for p in files) and len(files) > 100
    offenders = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if SOURCE_NUMBER.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "name the paper (authors, year, title) instead:\n" + "\n".join(offenders)
