"""forge_cached(): forge once per (arch, size, vision, seed, quant, FORGE_VERSION), reuse afterwards.

A cache entry is a directory that only ever appears complete: models are forged into a
private temporary directory next to it and renamed into place (an atomic rename on one
filesystem). A crashed run leaves at most a `.tmp-*` directory, which later calls sweep
once it is old; concurrent runs both forge, one rename wins, the loser discards its copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from cachepolicy.engine.cache_dir import cache_root

from .build import MMPROJ_FILE, MODEL_FILE, ForgedModel, check_request, describe, forge
from .errors import ForgeError
from .specs import FORGE_VERSION

#: temp dirs older than this are assumed to belong to dead processes
_STALE_TMP_SECONDS = 3600.0


def default_cache_dir() -> Path:
    """$KVAGENT_CACHE_DIR if set, else ~/.cache/kvagent/models (the engine's rule)."""
    return cache_root()


def entry_name(arch: str, size: str, *, vision: bool, seed: int, quant: str = "f16") -> str:
    """The cache directory name of one forge request (f16 entries carry no quant tag)."""
    tag = "" if quant == "f16" else f"-{quant}"
    return f"{arch}-{size}-{'v' if vision else 't'}-s{seed}{tag}-{FORGE_VERSION}"


def _complete(entry: Path, vision: bool) -> bool:
    return (entry / MODEL_FILE).is_file() and (not vision or (entry / MMPROJ_FILE).is_file())


def _sweep_stale(cache_dir: Path, name: str) -> None:
    now = time.time()
    for tmp in cache_dir.glob(f".tmp-{name}-*"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # another process removed or renamed it meanwhile


def forge_cached(
    arch: str, size: str, *, vision: bool = False, seed: int = 0, quant: str = "f16",
    cache_dir: Path | None = None,
) -> ForgedModel:
    """Return the cached model for this request, forging it first if it is not cached yet.

    The entry lives in `cache_dir / entry_name(...)` (cache_dir defaults to
    default_cache_dir()). An existing entry is never rewritten.
    """
    check_request(arch, size, seed, quant)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache_dir.exists() and not cache_dir.is_dir():
        raise ForgeError(f"cache_dir {cache_dir} exists and is not a directory")
    name = entry_name(arch, size, vision=vision, seed=seed, quant=quant)
    entry = cache_dir / name
    if _complete(entry, vision):
        return describe(arch, size, entry, vision=vision, seed=seed, quant=quant)

    cache_dir.mkdir(parents=True, exist_ok=True)
    _sweep_stale(cache_dir, name)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=cache_dir))
    try:
        forge(arch, size, tmp, vision=vision, seed=seed, quant=quant)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        if entry.exists() and not _complete(entry, vision):
            # Not produced by a forge (they only rename complete dirs in): replace it.
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not _complete(entry, vision):
                raise
            # lost a race against another process: its (identical) entry stands
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return describe(arch, size, entry, vision=vision, seed=seed, quant=quant)
