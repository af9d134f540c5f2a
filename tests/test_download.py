"""The download script fails with one clear line when it cannot reach the network."""
import urllib.error

import pytest

from domainbed.downloads import fetching, weights
from domainbed.scripts import download
from oodutils.errors import UserError


def test_offline_download_is_a_clear_error(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(fetching.urllib.request, "urlopen", unreachable)
    with pytest.raises(UserError, match="could not download .*network"):
        fetching.fetch("https://example.invalid/x.tar.gz", str(tmp_path / "x.tar.gz"))
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_fetch_and_extract_archive(tmp_path):
    import tarfile
    src = tmp_path / "src"
    (src / "spawrious224" / "0").mkdir(parents=True)
    (src / "spawrious224" / "0" / "a.txt").write_text("x")
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "spawrious224", arcname="spawrious224")
    dst = tmp_path / "data"
    dst.mkdir()
    fetching.fetch(archive.as_uri(), str(dst / "a.tar.gz"))
    fetching.extract(str(dst / "a.tar.gz"), str(dst))
    assert (dst / "spawrious224" / "0" / "a.txt").read_text() == "x"
    assert not (dst / "a.tar.gz").exists()


def test_unknown_names(tmp_path):
    with pytest.raises(UserError, match="unknown dataset 'Nope'"):
        download.main(["--data_dir", str(tmp_path), "--datasets", "Nope"])
    with pytest.raises(UserError, match="unknown weights"):
        weights.download_weights("vgg")


def test_help_needs_no_pooch_and_a_download_without_it_is_one_line(tmp_path):
    """pooch is imported when a file is fetched, never for --help; without it a download
    fails in one line naming the extra that installs it."""
    import subprocess
    import sys
    probe = ("import sys; sys.modules['pooch'] = None; sys.argv = ['domainbed-download'] + "
             "sys.argv[1:]; from domainbed.scripts.download import cli; cli()")
    shown = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and "--datasets" in shown.stdout, shown.stderr
    failed = subprocess.run([sys.executable, "-c", probe, "--datasets", "MetaShift",
                             "--data_dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    lines = [line for line in failed.stderr.splitlines() if "pooch" in line]
    assert len(lines) == 1 and "pip install 'oodbed[download]'" in lines[0], failed.stderr
