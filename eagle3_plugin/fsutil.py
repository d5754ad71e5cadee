"""Write a folder all at once: build it beside its destination, rename it into place at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from .errors import Eagle3Error


def read_json_object(path: str, what: str = "file") -> dict:
    """The JSON object in ``path``; a missing file, bad JSON or a non-object is one :class:`Eagle3Error`."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: no such {what}") from None
    except json.JSONDecodeError as e:
        raise Eagle3Error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise Eagle3Error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


@contextlib.contextmanager
def atomic_directory(path: str, force: bool = False):
    """Yield a temporary folder that becomes ``path`` only if the block succeeds.

    An existing ``path`` is refused unless ``force``; on any error the temporary folder is removed and
    ``path`` is left exactly as it was.
    """
    path = os.path.abspath(path)
    if os.path.exists(path) and not force:
        raise Eagle3Error(f"{path}: output folder already exists (use --force to replace it)")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        yield tmp
        _default_permissions(tmp)
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.replace(path, os.path.join(old, "x"))
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _default_permissions(folder: str) -> None:
    """Give the finished folder the modes a plain mkdir/open would (mkdtemp and some writers use 0700/0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)
