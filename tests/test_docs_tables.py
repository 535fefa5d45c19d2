"""Every table the docs mark as printed by scripts/epoch_table.py is what that
command prints now from the committed results: a table cannot drift from its runs.

A marked table sits between "<!-- table: scripts/epoch_table.py ARGS -->" and
"<!-- end of table -->".
"""
import glob
import os
import re
import shlex

import pytest

from conftest import ROOT

MARKED = re.compile(r"<!-- table: scripts/epoch_table\.py (.+?) -->\n(.*?)<!-- end of table -->", re.S)
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]


def marked_tables():
    for path in DOCS:
        with open(path) as f:
            for match in MARKED.finditer(f.read()):
                yield pytest.param(match.group(1), match.group(2), id=f"{os.path.basename(path)}: {match.group(1)}")


@pytest.mark.parametrize("args, text", list(marked_tables()))
def test_a_marked_table_is_its_command_output(args, text, capsys, monkeypatch):
    from scripts import epoch_table
    monkeypatch.chdir(ROOT)
    assert epoch_table.main(shlex.split(args)) == 0
    assert capsys.readouterr().out == text


def test_the_docs_have_marked_tables():
    assert len(list(marked_tables())) >= 3
