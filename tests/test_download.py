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
