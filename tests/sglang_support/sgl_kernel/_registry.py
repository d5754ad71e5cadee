"""Register plain-torch functions as ``torch.ops.sgl_kernel.<name>`` (CPU kernels), as sglang expects.

With ``SGL_KERNEL_STANDIN_COUNTS=<dir>`` set, every process counts the calls of each kernel and keeps
them in ``<dir>/<pid>.json`` (rewritten on each call: SGLang kills its workers, so no exit hook would run),
to check which kernels a server run really used.
"""

import collections
import functools
import json
import os

import torch

_LIB = torch.library.Library("sgl_kernel", "DEF")  # kept alive for the life of the process
_COUNTS_DIR = os.environ.get("SGL_KERNEL_STANDIN_COUNTS")
_COUNTS = collections.Counter()


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _COUNTS[fn.__name__] += 1
        with open(os.path.join(_COUNTS_DIR, f"{os.getpid()}.json"), "w") as f:
            json.dump(dict(_COUNTS), f)
        return fn(*args, **kwargs)
    return wrapper


def op(schema: str):
    """Decorator: define ``sgl_kernel::<schema>`` with the function as its CPU kernel; return the function.

    The function stays a plain Python callable too, so ``from sgl_kernel import name`` call sites
    (which pass keyword arguments) and ``torch.ops.sgl_kernel.name`` call sites run the same code.
    """
    def wrap(fn):
        if _COUNTS_DIR:
            fn = _counted(fn)
        _LIB.define(schema)
        _LIB.impl(schema.split("(", 1)[0], fn, "CPU")
        return fn
    return wrap
