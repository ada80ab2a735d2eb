"""Dependencies point one way (the developers' guide): the i2d2 utilities import none of the top-level
``callbacks/``, ``critics/``, ``trainers/``; those never import a recipe or an entry point; recipes and entry points
use everything. Function-level imports count too (every import statement in the file is read)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP = ("callbacks", "critics", "trainers")
# recipe level: the recipes and the command-line entry points
RECIPE_LEVEL = ("i2d2/recipes/", "i2d2/train.py", "i2d2/generate.py", "i2d2/negate.py", "i2d2/annotate.py")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(*roots: str):
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def test_i2d2_utilities_do_not_import_the_top_level_packages():
    bad = [f"{_rel(p)} imports {m}" for p in _files("i2d2") if not _rel(p).startswith(RECIPE_LEVEL)
           for m in _imports(p) if m.split(".")[0] in TOP]
    assert bad == [], bad


def test_top_level_packages_never_import_recipes_or_entry_points():
    entry = {"i2d2.recipes", "i2d2.train", "i2d2.generate", "i2d2.negate", "i2d2.annotate"}
    bad = [f"{_rel(p)} imports {m}" for p in _files(*TOP) for m in _imports(p)
           if any(m == e or m.startswith(e + ".") for e in entry)]
    assert bad == [], bad
