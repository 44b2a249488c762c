"""Files shipped inside the package (topology files, userbuffer tables), found by a bare name.

A flag that takes a file (``--topology-file``, ``--tp-comm-overlap-cfg``) reads the path as given;
only a bare name (``ring``, ``ring.yaml``: no directory in it) that is no file here falls back to
the shipped file of that name, with or without ``.yaml``. A path naming a directory
(``/nonexistent/ring.yaml``) never does.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from .errors import ConfigError


def package_dir(package: str) -> Path:
    """The folder of a data package (``triosim.topologies``)."""
    return Path(str(importlib.resources.files(package)))


def resolve_shipped(path: str | Path, package: str, flag: str, what: str) -> Path:
    """``path`` as given if it is a file, else the shipped file a bare name names; otherwise a
    one-line error listing the shipped ``what`` (``--topology-file x: file not found (shipped
    topologies: ...)``)."""
    p = Path(path)
    if p.is_file():
        return p
    folder = package_dir(package)
    bare = str(path) == p.name and p.name not in ("", ".", "..")
    for cand in (folder / p.name, folder / f"{p.name}.yaml") if bare else ():
        if cand.is_file():
            return cand
    shipped = sorted(x.stem for x in folder.glob("*.yaml"))
    raise ConfigError(f"{flag} {path}: file not found (shipped {what}: {', '.join(shipped) or 'none'})")


__all__ = ["package_dir", "resolve_shipped"]
