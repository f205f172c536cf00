"""The README's feature map names files and symbols that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "npusim"


def _feature_rows() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Feature map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("feature", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def _is_defined(path: Path, symbol: str) -> bool:
    code = path.read_text()
    name = re.escape(symbol)
    if path.suffix == ".py":
        pattern = rf"^\s*(def|class)\s+{name}\b|^{name}\s*[:=]"
    else:
        pattern = rf"\b(class|struct)\s+{name}\b|\b{name}\s*\("
    return re.search(pattern, code, re.MULTILINE) is not None


def _references(cell: str) -> list[tuple[str, str | None]]:
    """(file, symbol or None) for each backticked reference; a bare symbol belongs to the file before it."""
    refs: list[tuple[str, str | None]] = []
    current: str | None = None
    for span in re.findall(r"`([^`]+)`", cell):
        if span.startswith("python -m"):
            continue
        path, sep, symbol = span.partition(": ")
        if sep or "/" in span or span.endswith((".py", ".cpp", ".h")):
            current = path
            refs.append((path, symbol or None))
        else:
            assert current is not None, f"feature map cell {cell!r}: symbol {span!r} before any file"
            refs.append((current, span))
    files = sorted({file for file, _ in refs})
    for note in re.findall(r"Note \[([^\]]+)\]", cell):
        assert files, f"feature map cell {cell!r}: a Note before any file"
        refs.append(("|".join(files), f"Note [{note}]"))  # defined in one of the row's files
    return refs


def test_every_feature_map_reference_exists():
    """Each `file: symbol` of the README feature map names an existing file defining that symbol."""
    rows = _feature_rows()
    assert len(rows) >= 20
    missing = []
    for feature, cell in rows:
        refs = _references(cell)
        assert refs, f"feature {feature!r} names no file"
        for file, symbol in refs:
            if symbol is not None and symbol.startswith("Note ["):
                if not any(symbol in (PACKAGE / f).read_text() for f in file.split("|") if (PACKAGE / f).is_file()):
                    missing.append(f"{feature}: none of {file} has {symbol}")
                continue
            path = PACKAGE / file
            if not path.is_file():
                missing.append(f"{feature}: no file {file}")
            elif symbol is None:
                continue
            elif not _is_defined(path, symbol):
                missing.append(f"{feature}: {file} does not define {symbol}")
    assert not missing, "\n".join(missing)
