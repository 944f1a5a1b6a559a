"""docs/architecture.md matches the code: every room has its paragraph, every module and Rust
file is named in its room's paragraph, the modules that import the compiled extension are the
ones the page lists, the layer diagram holds for every import, and every function the walks
name exists.

The page's conventions, which this test reads:

- A room's paragraph starts with a heading ``### `NAME` ``. NAME is relative to
  ``python/unskit``: a package with a trailing slash (``camera/backends/``, and the stub
  package ``_core/``, whose ``__init__.pyi`` stands for the compiled extension) or a top-level
  module with its ``.py`` (``cli.py``); a Rust crate is named by its path (``rust/unskit-py``).
- A package's paragraph names each of its modules ticked, by file name (``ptz.py`` under
  ``camera/``); a crate's paragraph names each source file ticked, by its path below
  ``src/`` (``cip/io.rs``; ``lib.rs`` and a folder's ``mod.rs`` stand for themselves).
- The ``_core/`` paragraph has a sentence ``Imported by:`` followed by the ticked modules
  that import ``unskit._core`` (paths relative to ``python/unskit``), up to a blank line.
- The layer diagram is the first fenced block under ``## Layering``: one line per layer,
  ``N  room room ...`` (a comment in parentheses may follow), rooms named as above, N
  growing upwards.
- Walk sections are the ``## Walk`` ones. Each Python step is a dotted path
  ``unskit.module.Class.method`` (or ``unskit.module.function``); each Rust step is
  ``rust/<crate>/src/<file>.rs::Item::fn``. Third-party names are spelled with their package
  (``pycomm3.LogixDriver.read``) and not checked.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "unskit"
PAGE = ROOT / "docs" / "architecture.md"

#: Rooms outside the layer diagram: the package's face, and the test oracles.
OUTSIDE = {"__init__.py", "_reference/"}
#: Upward imports the page states as exceptions: (importing room, imported room).
EXCEPTIONS = {("demo/", "cli.py")}
#: Dotted names in a walk that belong to a third-party library, not to unskit.
THIRD_PARTY = ("pycomm3.", "paho.")

_HEADING = re.compile(r"^### `([^`]+)`", re.MULTILINE)
_TICKED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_RUST = re.compile(r"(rust/[\w/.-]+\.rs)((?:::\w+)*)")


@cache
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(title_prefix: str) -> list[str]:
    """The bodies of the ``## `` sections whose title starts with `title_prefix`."""
    parts = re.split(r"^## ", page(), flags=re.MULTILINE)[1:]
    return [part for part in parts if part.startswith(title_prefix)]


def packages() -> list[str]:
    """Every package under python/unskit (``__init__.py`` or, for _core, ``__init__.pyi``)."""
    found = {
        init.parent.relative_to(PACKAGE).as_posix() + "/"
        for pattern in ("*/**/__init__.py", "*/**/__init__.pyi")
        for init in PACKAGE.glob(pattern)
    }
    return sorted(found)


def top_modules() -> list[str]:
    return sorted(path.name for path in PACKAGE.glob("*.py"))


def headings() -> set[str]:
    return set(_HEADING.findall(page()))


@pytest.mark.parametrize("room", packages() + top_modules())
def test_every_package_and_top_level_module_has_a_paragraph(room):
    assert room in headings(), f"docs/architecture.md has no '### `{room}`' paragraph"


@pytest.mark.parametrize("crate", ["rust/unskit-core", "rust/unskit-py"])
def test_both_rust_crates_have_a_paragraph(crate):
    assert crate in headings()


def paragraph(name: str) -> str:
    """The text under the ``### `name` `` heading, up to the next heading."""
    match = re.search(rf"^### `{re.escape(name)}`\n(.*?)(?=^##)", page(), re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/architecture.md has no '### `{name}`' paragraph"
    return match[1]


def modules() -> list[tuple[str, str]]:
    """(package, module file name) for every module inside a package."""
    found = []
    for package in packages():
        folder = PACKAGE / package
        for path in sorted([*folder.glob("*.py"), *folder.glob("*.pyi")]):
            if path.stem != "__init__":
                found.append((package, path.name))
    return found


@pytest.mark.parametrize(("package", "module"), modules())
def test_every_module_is_named_in_its_package_paragraph(package, module):
    named = set(_TICKED.findall(paragraph(package)))
    assert module in named, f"the paragraph of {package} does not name `{module}`"


def rust_files(crate: str) -> list[str]:
    src = ROOT / crate / "src"
    return sorted(path.relative_to(src).as_posix() for path in src.rglob("*.rs"))


@pytest.mark.parametrize(
    ("crate", "file"),
    [
        (crate, file)
        for crate in ("rust/unskit-core", "rust/unskit-py")
        for file in rust_files(crate)
    ],
)
def test_every_rust_file_is_named_in_its_crate_paragraph(crate, file):
    if file == "lib.rs" or file.endswith("/mod.rs"):
        return
    named = set(_TICKED.findall(paragraph(crate)))
    assert file in named, f"the paragraph of {crate} does not name `{file}`"


def core_importers() -> set[str]:
    """Every module (path relative to python/unskit) that imports unskit._core."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        package = ["unskit", *rel.parent.parts]
        for node in ast.walk(tree_of(path)):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any(name == "unskit._core" or name.startswith("unskit._core.") for name in names):
                found.add(rel.as_posix())
    return found


def test_the_page_lists_the_modules_that_import_the_extension():
    text = paragraph("_core/")
    assert "Imported by:" in text, "the _core/ paragraph has no 'Imported by:' list"
    listed = set(_TICKED.findall(text.split("Imported by:", 1)[1].split("\n\n", 1)[0]))
    assert listed == core_importers(), (
        f"missing from the page: {sorted(core_importers() - listed)}; "
        f"listed but not importing _core: {sorted(listed - core_importers())}"
    )


def test_every_paragraph_names_a_room_that_exists():
    for name in headings():
        path = ROOT / name if name.startswith("rust/") else PACKAGE / name
        assert path.exists(), f"the page has a paragraph on {name}, which does not exist"


# -- the layer diagram ------------------------------------------------------------------------


def layers() -> dict[str, int]:
    """Room -> layer number, from the page's diagram."""
    (body,) = section("Layering")
    block = body.split("```", 2)[1]
    found: dict[str, int] = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\d+)\s+(.*)", line)
        if match is None:
            continue
        # What follows "(" on a line is a comment.
        for token in match[2].split("(")[0].split():
            found[token] = int(match[1])
    return found


def room_of(parts: list[str]) -> str:
    """The room of ``unskit.<parts...>``: its package (``camera/``) or module (``cli.py``)."""
    if not parts:
        return "__init__.py"
    head = parts[0]
    if (PACKAGE / head).is_dir():
        return head + "/"
    if (PACKAGE / f"{head}.py").exists():
        return f"{head}.py"
    return "__init__.py"  # `from unskit import Name`: the package's face


def imports() -> Iterator[tuple[str, str, str]]:
    """(importing room, imported room, where) for every import of unskit in the package,
    lazy (function-level) imports included."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        source = room_of(list(rel.with_suffix("").parts))
        package = ["unskit", *rel.parent.parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = [*base, *(node.module.split(".") if node.module else [])]
                else:
                    module = (node.module or "").split(".")
                if module == ["unskit"]:
                    targets = [["unskit", alias.name] for alias in node.names]
                elif module[0] == "unskit":
                    targets = [module]
            elif isinstance(node, ast.Import):
                dotted = [alias.name.split(".") for alias in node.names]
                targets = [name for name in dotted if name[0] == "unskit"]
            for target in targets:
                room = room_of(target[1:])
                if room != source:
                    yield source, room, f"{rel}:{node.lineno}"


def test_every_room_is_placed_in_the_diagram_or_named_outside_it():
    placed = layers()
    rooms = [p for p in packages() if p.count("/") == 1] + top_modules()
    for room in rooms:
        assert room in placed or room in OUTSIDE, f"{room} is in no layer of the diagram"
    for room in placed:
        assert room in rooms, f"the diagram places {room}, which does not exist"


def test_a_room_imports_only_the_layers_below_it():
    placed = layers()
    wrong = []
    for source, target, where in imports():
        assert target != "_reference/", f"{where}: the test oracles are imported"
        if source in OUTSIDE or (source, target) in EXCEPTIONS:
            continue
        if target == "__init__.py" or placed[target] >= placed[source]:
            wrong.append(f"{where}: {source} (layer {placed[source]}) imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_stated_exceptions_are_still_real():
    # An exception the code no longer has must leave the page (and this test) too.
    found = {(source, target) for source, target, _ in imports()}
    assert found >= EXCEPTIONS


# -- the walks --------------------------------------------------------------------------------


def walk_references(body: str) -> tuple[list[str], list[str]]:
    """The walk's Python dotted paths and its Rust references."""
    python, rust = [], []
    for token in _TICKED.findall(body):
        rust_match = _RUST.fullmatch(token)
        if rust_match:
            rust.append(token)
        elif _DOTTED.fullmatch(token) and not token.endswith((".py", ".rs")):
            python.append(token)
    return python, rust


def module_file(parts: list[str]) -> tuple[Path, int] | None:
    """The longest prefix of ``unskit.<parts>`` that is a module: (its file, its length)."""
    for end in range(len(parts), 0, -1):
        base = PACKAGE.joinpath(*parts[:end])
        for candidate in (
            base.with_suffix(".py"),
            base.with_suffix(".pyi"),
            base / "__init__.py",
            base / "__init__.pyi",
        ):
            if candidate.is_file():
                return candidate, end
    return None


@cache
def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (imports count, at module level)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = node
    return names


def python_problem(reference: str) -> str | None:
    """Why `reference` names nothing in the code, or None when it does."""
    parts = reference.split(".")
    if parts[0] != "unskit":
        return None if reference.startswith(THIRD_PARTY) else "not an unskit path"
    found = module_file(parts[1:])
    if found is None:
        return "no such module"
    path, length = found
    body: list[ast.stmt] = tree_of(path).body
    for name in parts[1 + length :]:
        node = defined(body).get(name)
        if node is None:
            return f"{path.relative_to(ROOT)} defines no {name!r} there"
        body = node.body if isinstance(node, ast.ClassDef) else []
    return None


def rust_problem(reference: str) -> str | None:
    match = _RUST.fullmatch(reference)
    assert match is not None
    path = ROOT / match[1]
    if not path.is_file():
        return "no such file"
    text = path.read_text(encoding="utf-8")
    for name in filter(None, match[2].split("::")):
        if not re.search(rf"\b(?:fn|struct|enum|trait|type|const|static|mod)\s+{name}\b", text):
            return f"{match[1]} defines no {name!r}"
    return None


WALKS = section("Walk")


def test_the_page_walks_an_opcua_data_change_and_a_class1_datagram_to_the_broker():
    titles = [body.splitlines()[0] for body in WALKS]
    assert any("OPC UA data change" in title for title in titles), titles
    assert any("class-1 datagram" in title for title in titles), titles
    for body in WALKS:
        python, rust = walk_references(body)
        assert len(python) >= 20, "a walk names the functions it passes through"
        assert rust, "each walk crosses into the Rust core"


@pytest.mark.parametrize(
    "reference",
    sorted({ref for body in WALKS for ref in walk_references(body)[0]}),
)
def test_every_python_function_a_walk_names_exists(reference):
    assert python_problem(reference) is None, f"{reference}: {python_problem(reference)}"


@pytest.mark.parametrize(
    "reference",
    sorted({ref for body in WALKS for ref in walk_references(body)[1]}),
)
def test_every_rust_item_a_walk_names_exists(reference):
    assert rust_problem(reference) is None, f"{reference}: {rust_problem(reference)}"


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("unskit.cip.poll.PollDriver.nope", "defines no 'nope'"),
        ("unskit.cip.nope.PollDriver", "defines no 'nope'"),
        ("unskit.nope.PollDriver", "no such module"),
        ("unskit.cip.poll.read", "defines no 'read'"),  # a method is not a module function
        ("PollDriver.read", "not an unskit path"),
    ],
)
def test_the_walk_check_refuses_what_does_not_exist(reference, problem):
    assert problem in (python_problem(reference) or "")


def test_the_rust_check_refuses_what_does_not_exist():
    assert "defines no 'nope'" in (rust_problem("rust/unskit-core/src/lib.rs::nope") or "")
    assert rust_problem("rust/unskit-core/src/nope.rs") == "no such file"


# -- module size ------------------------------------------------------------------------------

#: A module longer than this does several jobs: split it by responsibility (issue 38).
MAX_MODULE_LINES = 600


def test_no_python_module_is_longer_than_the_limit():
    long = [
        f"{path.relative_to(PACKAGE)}: {count} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)
