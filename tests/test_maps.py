"""Maps kept true: tests/README.md has a row per test file, every cited Note is defined, every npusim
file a comment names exists, and runtime/acl.py matches the compiled core's bindings."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "npusim"
CSRC = PACKAGE / "csrc"
TESTS = ROOT / "tests"

# Notes of other projects that npusim's comments cite by name, with where they are defined.
EXTERNAL_NOTES = {"Interaction with CUDA graph capture": "PyTorch's c10/cuda/CUDACachingAllocator.cpp"}
# PyTorch sources C++ comments name by their bare file name.
EXTERNAL_CXX_FILES = {"CUDACachingAllocator.cpp", "DistributionTemplates.h", "TransformationHelper.h"}
# First path components that name npusim's own folders (the csrc floors and the Python packages).
OWN_FOLDERS = {p.name for p in CSRC.iterdir() if p.is_dir()} | {
    p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "csrc"} | {"csrc", "tests"}


def _sources() -> list[Path]:
    found = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".cpp", ".h") and p.is_file()]
    return sorted(found + list(TESTS.rglob("*.py")))


def _comment_text(path: Path) -> str:
    """The comments (and, in Python, the docstrings) of a source file."""
    text = path.read_text()
    if path.suffix != ".py":
        return "\n".join(m.group(1) for m in re.finditer(r"//(.*)$", text, re.MULTILINE))
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = [ast.get_docstring(n) or "" for n in ast.walk(ast.parse(text)) if isinstance(n, owners)]
    return "\n".join(comments + docstrings)


def _flatten(text: str) -> str:
    """One line, comment markers dropped, so that a title wrapped over two comment lines reads whole."""
    return re.sub(r"\s*\n[ \t]*(?://+|#+|\*)?[ \t]*", " ", text)


def _defined_notes() -> dict[str, Path]:
    """Title -> file for every definition: a line holding only the Note's name, which the comment (or
    the docstring) continues on the next line."""
    in_comment = re.compile(r"^[ \t]*(//|#)[ \t]*Note \[([^\]\n]+)\][ \t]*\n[ \t]*\1[ \t]*\S", re.MULTILINE)
    in_docstring = re.compile(r"^[ \t]*()Note \[([^\]\n]+)\][ \t]*\n[ \t]*\S", re.MULTILINE)
    return {m.group(2): path for path in _sources() for pattern in (in_comment, in_docstring)
            for m in pattern.finditer(path.read_text())}


def _cited_notes() -> dict[str, set[str]]:
    """Title -> the files that cite it: sources, README.md, docs/*.md and tests/README.md's Notes column."""
    cited: dict[str, set[str]] = {}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in [*_sources(), *pages]:
        for title in re.findall(r"Note \[([^\]]{1,120})\]", _flatten(path.read_text())):
            if "{" not in title:  # an f-string's placeholder
                cited.setdefault(" ".join(title.split()), set()).add(str(path.relative_to(ROOT)))
    for row in re.findall(r"^\| `test_\w+\.py` \|.*\| (.*) \|$", (TESTS / "README.md").read_text(), re.MULTILINE):
        for title in re.findall(r"\[([^\]]+)\]", row):
            cited.setdefault(title, set()).add("tests/README.md")
    return cited


def test_every_test_file_has_its_row():
    """Each tests/test_*.py has one row in tests/README.md, and each row names a test file that exists."""
    text = (TESTS / "README.md").read_text()
    rows = re.findall(r"^\| `(test_\w+\.py)` \|", text, re.MULTILINE)
    files = {p.name for p in TESTS.glob("test_*.py")}
    assert sorted(files - set(rows)) == [], "test files without a row in tests/README.md"
    assert sorted(set(rows) - files) == [], "rows of tests/README.md naming no test file"
    assert len(rows) == len(set(rows)), "a test file with two rows"


def test_every_cited_note_is_defined():
    """Each Note cited in the tree is defined (a comment paragraph opened by its name) somewhere."""
    defined = _defined_notes()
    missing = {title: sorted(where) for title, where in _cited_notes().items()
               if title not in defined and title not in EXTERNAL_NOTES}
    assert missing == {}, "cited Notes that nothing defines"


def _named_files(path: Path) -> set[str]:
    """npusim's own files that the comments of a source file name by path, and bare C++ file names."""
    names = set()
    for ref in re.findall(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:cpp|h|py))\b", _comment_text(path)):
        parts = ref.split("/")
        own_path = parts[0] in OWN_FOLDERS and (parts[0] in ("csrc", "tests") or len(parts) == 2)
        if ref.startswith(("src/npusim/", "npusim/")) or own_path:
            names.add(ref)
        elif len(parts) == 1 and path.suffix in (".cpp", ".h") and ref.endswith((".cpp", ".h")):
            names.add(ref)
    return names


def _exists(ref: str, path: Path) -> bool:
    if "/" not in ref:  # a bare C++ file name: any file of that name in csrc
        return ref in EXTERNAL_CXX_FILES or any(CSRC.rglob(ref))
    ref = ref.removeprefix("src/").removeprefix("npusim/")
    bases = [ROOT, PACKAGE, CSRC, path.parent, path.parent.parent]
    return any((base / ref).is_file() for base in bases)


def test_every_file_a_comment_names_exists():
    """Each npusim file a comment or docstring names by path (csrc/..., runtime/acl.py, ...) exists."""
    missing = []
    for path in _sources():
        where = str(path.relative_to(PACKAGE if path.is_relative_to(PACKAGE) else ROOT))
        for ref in _named_files(path):
            if not _exists(ref, path):
                missing.append(f"{where}: {ref}")
    assert missing == [], "comments naming files that do not exist:\n" + "\n".join(sorted(missing))


def _acl_bindings() -> tuple[dict[str, ast.expr | None], set[str]]:
    """acl.py's use of the core: {name: annotation} of `x: T = C.name` assignments, and every C.name read."""
    tree = ast.parse((PACKAGE / "runtime" / "acl.py").read_text())
    typed: dict[str, ast.expr | None] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else node.value
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "C":
                assert node.target.id == value.attr, f"acl.py renames C.{value.attr} to {node.target.id}"
                typed[value.attr] = node.annotation
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "C"}
    return typed, read


def _pybind_arity(function: object) -> tuple[int, int] | None:
    """(required, total) parameters from a pybind11 signature line, None when it shows none (overloads)."""
    lines = [line.strip() for line in (getattr(function, "__doc__", None) or "").splitlines() if line.strip()]
    match = re.match(r"\w+\((.*)\) -> .*$", lines[0]) if lines else None
    if match is None or "*args" in lines[0]:
        return None
    params = [p for p in re.split(r",\s*(?![^\[(]*[\])])", match.group(1)) if p]
    return sum("=" not in p for p in params), len(params)


def test_acl_matches_the_compiled_bindings():
    """Every name acl.py takes from the core is bound there; every binding is typed in acl.py (a
    `name: Callable[[...], R] = C.name` whose argument count fits the binding's signature, or a typed
    constant), except the internal ones wrapped by a typed function (INTERNAL)."""
    from npusim.runtime._core import C

    internal = {"core_api": "wrapped by acl.core_api_capsule() -> Any (a capsule for the dist extension)"}
    bound = {name for name in dir(C) if not name.startswith("__")}
    typed, read = _acl_bindings()
    assert sorted(read - bound) == [], "acl.py reads names the compiled core does not bind"
    assert sorted(bound - set(typed) - set(internal)) == [], "bindings without a typed name in acl.py"
    wrong = []
    for name, annotation in typed.items():
        if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Callable"):
            continue
        arguments = annotation.slice.elts[0] if isinstance(annotation.slice, ast.Tuple) else None
        arity = _pybind_arity(getattr(C, name))
        if isinstance(arguments, ast.List) and arity is not None:
            required, total = arity
            if not required <= len(arguments.elts) <= total:
                wrong.append(f"{name}: {ast.unparse(annotation)} against {required}..{total} parameters")
    assert wrong == [], "\n".join(wrong)
