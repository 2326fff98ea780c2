"""TensorRT-RTX's runtime cache on disk: the kernels it compiles just in time, shared by every
execution context of one engine and kept in a file (`<engine stem>.runtime.cache` by default) so
the next process loads them instead of compiling again.

    cache = RuntimeCacheFile.for_engine(engine_path, options.runtime_cache, flavor)
    config = engine.create_runtime_config(); cache.attach(config)   # per context
    ...
    cache.save()                                                     # at close
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

from trt_seer.files import atomic_write_bytes

log = logging.getLogger(__name__)


def runtime_cache_path(engine_path: Path) -> Path:
    """`x.fp16.engine` -> `x.fp16.runtime.cache`."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.stem + ".runtime.cache")


class RuntimeCacheFile:
    """One runtime cache object for all of an engine's contexts, read from and written to `path`
    (None: no cache, every call a no-op)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._cache, self._blob = None, b""

    @classmethod
    def for_engine(cls, engine_path: Path, option, flavor) -> "RuntimeCacheFile":
        """`option`: "auto" (beside the engine), a path, or None (off); off where the flavor has none."""
        if option is None or not flavor.has_runtime_cache:
            return cls(None)
        return cls(runtime_cache_path(engine_path) if option == "auto" else Path(option))

    def attach(self, config) -> None:
        """Gives an IRuntimeConfig the shared cache (created and loaded on first use)."""
        if self.path is None:
            return
        if self._cache is None:
            self._cache = config.create_runtime_cache()
            self._load()
        config.set_runtime_cache(self._cache)

    def _load(self) -> None:
        if not self.path.is_file():
            return
        blob = self.path.read_bytes()
        if self._cache.deserialize(blob):
            self._blob = blob
            log.debug("loaded runtime cache %s (%d bytes)", self.path, len(blob))
        else:
            log.info("runtime cache %s is from another GPU, driver or TensorRT-RTX release; "
                     "kernels will be compiled again and the cache rewritten", self.path)

    def save(self) -> None:
        """Writes the cache if it holds anything new (atomically); warns when the file cannot be
        written. Call once the contexts are idle."""
        if self._cache is None:
            return
        blob = bytes(memoryview(self._cache.serialize()))
        self._cache = None
        if not blob or blob == self._blob:
            return
        try:
            atomic_write_bytes(self.path, blob)
        except OSError as e:
            warnings.warn(f"could not save the runtime cache {self.path}: {e}; JIT kernels will "
                          "be compiled again next time", RuntimeWarning, stacklevel=3)
            return
        log.debug("saved runtime cache %s (%d bytes)", self.path, len(blob))
