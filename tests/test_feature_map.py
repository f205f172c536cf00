"""The feature map (docs/FEATURE_MAP.md) names files and symbols that exist; the README links every
feature to a section and a page that exist, and its self-contained examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "npusim"


def _feature_rows() -> list[tuple[str, str]]:
    section = (ROOT / "docs" / "FEATURE_MAP.md").read_text().split("| feature | implemented by |", 1)[1]
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
    """Each `file: symbol` of the feature map names an existing file defining that symbol."""
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



def test_every_core_source_file_has_a_feature():
    """Each csrc/ .cpp file (the unity units aside) is named, or its header is, by a row of the feature map:
    a file without one is a feature missing from the map."""
    named = {file for _, cell in _feature_rows() for files, _ in _references(cell) for file in files.split("|")}
    sources = sorted(p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "csrc").rglob("*.cpp")
                     if p.parent.name != "unity")
    unnamed = [s for s in sources if s not in named and s.removesuffix(".cpp") + ".h" not in named]
    assert unnamed == [], "csrc files no row of docs/FEATURE_MAP.md names"

def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_and_docs_links_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists; README's #anchors a heading."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            if file and not (page.parent / file).exists():
                broken.append(f"{page.name}: {target}")
            elif not file and anchor not in anchors:
                broken.append(f"{page.name}: #{anchor} is no heading")
    assert not broken, "\n".join(broken)


def _readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_readme_examples_run(tmp_path):
    """README's self-contained examples run; the FSDP2 script (and its continuation) under torchrun on 2 ranks."""
    blocks = _readme_python_blocks()
    standalone = [b for b in blocks if b.startswith("import torch")]
    assert len(standalone) >= 4
    for block in standalone:
        result = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300,
                                cwd=tmp_path)
        assert result.returncode == 0, f"README example failed:\n{block}\n{result.stderr[-3000:]}"
    torchrun_script = next(i for i, b in enumerate(blocks) if b.startswith("# torchrun"))
    script = tmp_path / "fsdp_example.py"
    # The enhancement block continues the FSDP2 script, as the README says.
    script.write_text(blocks[torchrun_script] + blocks[torchrun_script + 1] + "dist.destroy_process_group()\n")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_readme_and_benchmarks_stay_short():
    """The README is a one-screen tour with a short section per feature (under 250 lines), and
    docs/BENCHMARKS.md the current figures (under 400 lines; older ones go to BENCHMARKS-HISTORY.md)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    benchmarks = (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    assert len(readme) < 250, f"README.md has {len(readme)} lines: move long material to a docs/ page"
    assert len(benchmarks) < 400, f"docs/BENCHMARKS.md has {len(benchmarks)} lines: move history out"
