"""Child-process side of :func:`tokenloom.tokenize.corpus.build_stdlib_corpus`.

Run as ``python -I -S .../_stdlib_docs.py OUT MIN_CHARS MODULE...``: without
site-packages, so that nothing installed (e.g. setuptools' ``distutils`` shim,
loaded from a ``.pth`` file) changes what the standard library contains. Uses
the standard library only. Imports each module (and its submodules, except
tests and ``__main__``), collects own docstrings and writes a sorted JSON array
of ``[id, text]`` pairs to OUT; the parent rewrites it as jsonl.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import warnings
from types import ModuleType

_NEVER = frozenset({"__main__", "test", "tests", "idle_test", "antigravity", "this"})
_SKIPPED_TOP = frozenset(
    {"__hello__", "__phello__", "idlelib", "lib2to3", "pydoc_data", "tkinter", "turtle", "turtledemo"}
)


def _import(name: str) -> ModuleType | None:
    if any(part in _NEVER for part in name.split(".")) or name.split(".")[0] in _SKIPPED_TOP:
        return None
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except (Exception, SystemExit):  # any module that fails to import is skipped
        return None


def _walk(name: str, seen: set[str]) -> list[ModuleType]:
    module = _import(name)
    if module is None or name in seen:
        return []
    seen.add(name)
    found = [module]
    path = getattr(module, "__path__", None)
    if path is not None:
        for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
            if info.name.startswith("_") and info.name != "__init__":
                continue
            found.extend(_walk(f"{name}.{info.name}", seen))
    return found


def _own_doc(obj: object) -> str | None:
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else None


def _is_routine(obj: object) -> bool:
    return inspect.isroutine(obj) or isinstance(obj, (classmethod, staticmethod, property))


def _unwrap(obj: object) -> object:
    if isinstance(obj, (classmethod, staticmethod)):
        return obj.__func__
    if isinstance(obj, property):
        return obj.fget
    return obj


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _documents(module: ModuleType) -> dict[str, str]:
    docs: dict[str, str] = {}
    mod_name = module.__name__
    doc = _own_doc(module)
    if doc:
        docs[mod_name] = doc
    for name, obj in sorted(vars(module).items()):
        if not _public(name) or name.startswith("__"):
            continue
        if getattr(obj, "__module__", None) != mod_name:
            continue
        if inspect.isclass(obj):
            doc = _own_doc(obj)
            if doc:
                docs[f"{mod_name}.{name}"] = doc
            for attr, member in sorted(vars(obj).items()):
                if not _public(attr) or not _is_routine(member):
                    continue
                member_doc = _own_doc(_unwrap(member))
                if member_doc:
                    docs[f"{mod_name}.{name}.{attr}"] = member_doc
        elif _is_routine(obj):
            doc = _own_doc(obj)
            if doc:
                docs[f"{mod_name}.{name}"] = doc
    return docs


def collect(names: list[str], min_chars: int) -> list[tuple[str, str]]:
    docs: dict[str, str] = {}
    seen: set[str] = set()
    for name in sorted(names):
        for module in _walk(name, seen):
            docs.update(_documents(module))
    return sorted((key, text) for key, text in docs.items() if len(text) >= min_chars)


def main(argv: list[str]) -> int:
    out, min_chars, names = argv[0], int(argv[1]), argv[2:]
    rows = collect(names, min_chars)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(rows, fh, ensure_ascii=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
