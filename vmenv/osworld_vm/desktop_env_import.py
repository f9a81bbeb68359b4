"""Import OSWorld's ``desktop_env.desktop_env`` with light dependencies only.

``desktop-env`` 1.0.2 is installed with ``--no-deps`` (its declared dependencies include
torch).  Importing ``desktop_env.desktop_env`` then still needs, at module import time:

* light packages, installed by kvagent's ``test`` extra: gymnasium, requests,
  requests-toolbelt, python-dotenv, and for ``evaluators/metrics/utils.py`` (which
  ``controllers/setup.py`` imports) openpyxl, lxml, tldextract, xmltodict;
* ``from desktop_env.evaluators import metrics, getters``: the two packages' ``__init__``
  import every metric and getter module, and with them easyocr → torch, librosa, opencv,
  scikit-image, PyMuPDF, borb, pandas, ...  **Unavoidable and heavy**, so
  ``load_desktop_env`` registers the two packages *lazily* before the import: same
  directory, same submodules, same functions — the ``from .x import name`` lines of the
  real ``__init__`` become a name → submodule table, and ``getattr(metrics, name)`` (how
  DesktopEnv looks metrics and getters up) imports ``x`` on first use.  The rest of each
  ``__init__`` (``metrics.infeasible``) runs as written.  Nothing of OSWorld is copied or
  edited; only what a task's evaluator names gets imported;
* three packages that ``controllers/setup.py`` / ``metrics/utils.py`` import only for setup
  steps and metrics kvagent never uses — playwright (Chrome setup, ~165 MB with its driver),
  pydrive (Google Drive setup; google-api-python-client, ~120 MB) and formulas (spreadsheet
  metrics; schedula + scipy, ~150 MB).  When one is *not installed*, a placeholder module
  stands in: importing works, and any use raises ``ModuleNotFoundError`` naming the package.
  Installed ones are used as they are.

Used with a full OSWorld installation, the lazy packages resolve to the same functions, so
``load_desktop_env`` changes nothing but import time.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

#: How to get OSWorld's code without its heavy dependencies.
DESKTOP_ENV_INSTALL = "pip install --no-deps desktop-env==1.0.2"
_LAZY_PACKAGES = ("desktop_env.evaluators.metrics", "desktop_env.evaluators.getters")
#: Modules imported at import time for features kvagent never uses → the pip package.
_IMPORT_ONLY = {
    "playwright.sync_api": "playwright",
    "pydrive.auth": "pydrive",
    "pydrive.drive": "pydrive",
    "formulas": "formulas",
}


def load_desktop_env() -> ModuleType:
    """``desktop_env.desktop_env``, importable with the light dependencies (see the module
    docstring), with kvagent's loopback provider installed (``provider``).  Raises
    ``ModuleNotFoundError`` if desktop-env itself is not installed."""
    if "desktop_env.desktop_env" not in sys.modules:
        if importlib.util.find_spec("desktop_env") is None:
            raise ModuleNotFoundError(f"OSWorld's desktop_env is not installed: "
                                      f"{DESKTOP_ENV_INSTALL}", name="desktop_env")
        for name in _LAZY_PACKAGES:
            _install_lazy_package(name)
        for module, package in _IMPORT_ONLY.items():
            _install_placeholder(module, package)
    module = importlib.import_module("desktop_env.desktop_env")
    # the provider subclasses OSWorld's classes: importable only once desktop_env is loaded
    from vmenv.osworld_vm.provider import install_loopback_provider
    install_loopback_provider(module)
    return module


def _install_lazy_package(name: str) -> None:
    if name in sys.modules:
        return  # already imported (e.g. eagerly, with all of OSWorld's dependencies)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"{name} is not a package here", name=name)
    source = Path(spec.origin).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=spec.origin)
    table: dict[str, str] = {}  # public name → submodule (relative, one level)
    rest: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
            for alias in stmt.names:
                table[alias.asname or alias.name] = stmt.module
        else:
            rest.append(stmt)
    module = importlib.util.module_from_spec(spec)
    module.__getattr__ = _lazy_getattr(name, table)  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(importlib.import_module(parent), child, module)
    # the package's own definitions (e.g. metrics.infeasible), without the eager imports
    exec(compile(ast.Module(body=rest, type_ignores=[]), spec.origin, "exec"),  # noqa: S102
         module.__dict__)


def _lazy_getattr(package: str, table: dict[str, str]) -> Any:
    def __getattr__(attr: str) -> Any:  # PEP 562: called only for names not yet set
        sub = table.get(attr)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), attr)
        setattr(sys.modules[package], attr, value)
        return value
    return __getattr__


class _Absent(Exception):  # noqa: N818  (a stand-in class, never raised by itself)
    """Base of the placeholder classes: usable in ``except`` clauses, never constructible."""

    package = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Absent:
        raise ModuleNotFoundError(
            f"{cls.__module__}.{cls.__name__} needs {cls.package!r}, which is not installed "
            f"(kvagent loads OSWorld without it: only import-time references are served)",
            name=cls.package)


def _install_placeholder(module: str, package: str) -> None:
    top = module.partition(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and not getattr(loaded, "kvagent_placeholder", False):
        return  # imported already: the real one is used
    if loaded is None and importlib.util.find_spec(top) is not None:
        return  # installed: the real one is used
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            sys.modules[name] = _placeholder_module(name, package)


def _placeholder_module(name: str, package: str) -> ModuleType:
    mod = ModuleType(name, f"placeholder for {name} ({package} is not installed)")
    mod.kvagent_placeholder = True  # type: ignore[attr-defined]

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        cls = type(attr, (_Absent,), {"__module__": name, "package": package})
        setattr(mod, attr, cls)
        return cls
    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod
