"""JAX's persistent compilation cache, turned on for a process (train.py does, by default).

    directory = enable_compilation_cache("auto")   # or a directory, or "off"

Compiled programs are written to disk, and a later run that compiles the same program (same
shapes, JAX version, devices and flags) loads it instead: a restarted or repeated run skips its
compiles.
"""

from __future__ import annotations

import os

import jax


def default_compilation_cache_dir() -> str:
    """$XDG_CACHE_HOME/bert_jax/jax, by default ~/.cache/bert_jax/jax."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bert_jax", "jax")


def enable_compilation_cache(directory: str = "auto") -> str | None:
    """Turns JAX's persistent compilation cache on (or off) for this process.

    Compiled programs are written to disk, and a later run that compiles the same program (same
    shapes, JAX version, devices and flags) loads it instead: a restarted or repeated fine-tuning
    run skips its compiles. JAX writes only programs that took at least
    `jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile. Call it before the
    first compile.

    Args:
      directory: "auto": $JAX_COMPILATION_CACHE_DIR if set, else `default_compilation_cache_dir()`;
        "off": no persistent cache; anything else: the cache directory.

    Returns:
      The cache directory, or None when off.
    """
    if not directory:
        raise ValueError("the compilation cache directory is empty; use 'auto', 'off' or a path")
    if directory == "off":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if directory == "auto":
        directory = jax.config.jax_compilation_cache_dir or default_compilation_cache_dir()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory
