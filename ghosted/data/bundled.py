"""The bundled texts from gensim's test data, and Wikipedia cleaning (markup -> paragraphs).

Why: gensim's wheel bundles the Lee news corpus (clean prose, one article per line) and a
106-article English Wikipedia dump sample, the closest offline stand-in for WikiText. The dump's
raw text is full of templates, references, tables and links. Cleaning it with mwparserfromhell
takes ~10 s on a small CPU, so the result is stored once as JSON under a user cache dir, keyed
by the dump's sha256 and CLEANER_VERSION (bump it whenever the cleaning rules change so stale
caches are ignored).
"""

from __future__ import annotations

import bz2
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import mwparserfromhell
from mwparserfromhell.nodes import (
    ExternalLink, Heading, HTMLEntity, Node, Tag, Text, Wikilink,
)
from mwparserfromhell.wikicode import Wikicode

from ghosted.models.assets import cache_dir, file_sha256, package_dir

CLEANER_VERSION = 1  # bump when clean_wikitext changes; old cache files are then ignored
GENSIM_INSTALL = "pip install --no-deps gensim==4.4.0"
WIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
BUNDLED_FILES = {"bundled:news": "lee_background.cor", "bundled:wiki": WIKI_DUMP}  # in test_data
MIN_WORDS = 8  # paragraphs shorter than this are headings, captions or list debris

# Tags whose whole content is dropped (citations, tables, formulas, galleries, ...).
_DROP_TAGS = {
    "ref", "references", "table", "gallery", "math", "timeline", "imagemap",
    "syntaxhighlight", "source", "score", "chem", "ce", "hiero", "poem", "graph",
}
_MEDIA_PREFIXES = ("file:", "image:", "media:", "category:")
_INTERLANG = re.compile(r"^[a-z]{2,3}(-[a-z]+)*:")  # [[de:Anarchismus]], [[zh-min-nan:...]]
_LIST_OR_TABLE_ROW = re.compile(r"^\s*[*#:;|!]|^\s*\{\|")  # list items, indents, table rows
_MAGIC_WORD = re.compile(r"__[A-Z]+__")  # __NOTOC__ and friends
_LEFTOVER = ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "<!--", "-->")


def gensim_data_dir() -> Path:
    """gensim's test_data folder, found without importing gensim (it would need scipy)."""
    folder = package_dir("gensim")
    folder = folder / "test" / "test_data" if folder else None
    if folder is None or not all((folder / f).is_file() for f in BUNDLED_FILES.values()):
        raise FileNotFoundError("The bundled texts come from gensim's test data, which is not "
                                f"installed. Install it with: {GENSIM_INSTALL}")
    return folder


def bundled_documents(name: str) -> list[str]:
    """Documents of a bundled source ("bundled:news" or "bundled:wiki"), in file order."""
    path = gensim_data_dir() / BUNDLED_FILES[name]
    if name == "bundled:wiki":
        return [article["text"] for article in load_clean_articles(path)]
    return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def read_dump(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(title, raw wikitext) for each main-namespace, non-redirect page of a .xml(.bz2) dump."""
    opener = bz2.open if str(path).endswith(".bz2") else open
    with opener(path, "rb") as fh:
        root = ET.parse(fh).getroot()
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    articles = []
    for page in root.iter(ns + "page"):
        title = page.findtext(ns + "title") or ""
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        if page.findtext(ns + "ns", "0") != "0" or page.find(ns + "redirect") is not None:
            continue
        if text.lstrip().upper().startswith("#REDIRECT"):
            continue
        articles.append((title, text))
    return articles


def _is_unwanted_link(title: str) -> bool:
    """True for File:/Image:/Category: links and interlanguage links (dropped whole)."""
    t = title.strip().lower()
    return t.startswith(_MEDIA_PREFIXES) or bool(_INTERLANG.match(t))


def _render(code: Wikicode | None) -> str:
    """Plain text of a parse tree, skipping unwanted nodes.

    Why not Wikicode.remove() + strip_code(): remove() searches the whole tree per node and
    made cleaning ~4x slower. One walk that skips nodes gives the same text.
    """
    if code is None:
        return ""
    return "".join(_render_node(node) for node in code.nodes)


def _render_node(node: Node) -> str:
    """Plain text of one node: templates, comments, dropped tags and media links vanish."""
    if isinstance(node, Text):
        return node.value
    if isinstance(node, HTMLEntity):
        return node.normalize()
    if isinstance(node, Wikilink):
        if _is_unwanted_link(str(node.title)):
            return ""
        return _render(node.text) if node.text is not None else _render(node.title)
    if isinstance(node, ExternalLink):
        return _render(node.title)  # a bare [http://...] has no readable text
    if isinstance(node, Heading):
        return _render(node.title)
    if isinstance(node, Tag):
        return _render_tag(node)
    return ""  # Template, Comment, Argument, ...


def _render_tag(node: Tag) -> str:
    """Tags: dropped ones vanish, list markers stay (so their rows get filtered), else contents."""
    name = str(node.tag).strip().lower()
    if name in _DROP_TAGS:
        return ""
    if name in ("li", "dt", "dd"):
        return str(node.wiki_markup or "*")  # keep the marker so the row filter sees it
    if name == "br":
        return " "
    return _render(node.contents)


def clean_wikitext(text: str, min_words: int = MIN_WORDS) -> list[str]:
    """Plain-text paragraphs of one article's wikitext.

    Templates, <ref>/tables/math, File:/Image:/Category:/interlanguage links and comments go;
    list and table rows go; link text is kept; paragraphs with < min_words words are dropped.
    """
    plain = _render(mwparserfromhell.parse(text))
    paragraphs = []
    for line in plain.split("\n"):
        if _LIST_OR_TABLE_ROW.match(line):
            continue
        line = " ".join(_MAGIC_WORD.sub(" ", line).split())
        if len(line.split()) >= min_words and not any(m in line for m in _LEFTOVER):
            paragraphs.append(line)
    return paragraphs


def clean_dump(path: str | os.PathLike) -> list[dict[str, str]]:
    """Clean every article of a dump: [{"title", "text"}], paragraphs joined by newlines.

    Articles left with no paragraph (stubs, lists) are dropped.
    """
    out = []
    for title, raw in read_dump(path):
        paragraphs = clean_wikitext(raw)
        if paragraphs:
            out.append({"title": title, "text": "\n".join(paragraphs)})
    return out


def cache_path(path: str | os.PathLike, folder: str | os.PathLike | None = None) -> Path:
    """Where the cleaned JSON for this dump lives: keyed by its sha256 and CLEANER_VERSION."""
    folder = Path(folder) if folder is not None else cache_dir() / "text"
    return folder / f"wiki-{file_sha256(Path(path))[:20]}-v{CLEANER_VERSION}.json"


def load_clean_articles(
    path: str | os.PathLike, folder: str | os.PathLike | None = None
) -> list[dict[str, str]]:
    """Cleaned articles of a dump, from the JSON cache if present, else cleaned and cached.

    The cache write is atomic (temp file + rename) so concurrent processes never read a
    half-written file; an unreadable cache file is simply rebuilt.
    """
    target = cache_path(path, folder)
    if target.exists():
        try:
            payload = json.loads(target.read_text(encoding="utf-8"))
            if payload.get("cleaner_version") == CLEANER_VERSION:
                return payload["articles"]
        except (OSError, ValueError, KeyError):
            pass  # corrupt or foreign file: rebuild below
    articles = clean_dump(path)
    payload = {"cleaner_version": CLEANER_VERSION, "source": os.path.basename(path),
               "articles": articles}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, target)
    return articles
