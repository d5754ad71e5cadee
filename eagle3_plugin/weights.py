"""Lazy access to checkpoint tensors and a streaming safetensors writer.

Opening a checkpoint reads only headers; each tensor is loaded when asked for, so converting a
checkpoint holds about one tensor in memory at a time. Pickled ``.bin`` files are opened only with
``torch.load(weights_only=True)`` (memory-mapped when they are zip archives).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from safetensors import SafetensorError, safe_open

from .errors import Eagle3Error

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}
_DTYPE_CODES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


@dataclass
class LazyTensor:
    shape: tuple
    dtype: torch.dtype
    loader: Callable[[], torch.Tensor]

    def load(self) -> torch.Tensor:
        return self.loader()

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


def open_tensors(folder: str) -> dict[str, LazyTensor]:
    """Every tensor of the checkpoint in ``folder``: single or sharded safetensors, or a safe ``.bin``."""
    single, index = os.path.join(folder, "model.safetensors"), os.path.join(folder, "model.safetensors.index.json")
    binary, bin_index = os.path.join(folder, "pytorch_model.bin"), os.path.join(folder, "pytorch_model.bin.index.json")
    if os.path.exists(single):
        return _open_safetensors(single)
    if os.path.exists(index) or os.path.exists(bin_index):
        index = index if os.path.exists(index) else bin_index
        opener = _open_safetensors if index.endswith(".safetensors.index.json") else _open_pickle
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise Eagle3Error(f"{index}: not a valid shard index ({e})") from None
        tensors: dict[str, LazyTensor] = {}
        for shard in shards:
            tensors.update(opener(os.path.join(folder, shard)))
        return tensors
    if os.path.exists(binary):
        return _open_pickle(binary)
    raise Eagle3Error(f"{folder}: no weights found (model.safetensors, model.safetensors.index.json "
                      f"or pytorch_model.bin)")


def _open_safetensors(path: str) -> dict[str, LazyTensor]:
    try:
        with open(path, "rb") as raw:
            header_len = struct.unpack("<Q", raw.read(8))[0]
        size = os.path.getsize(path)
        with safe_open(path, framework="pt") as f:
            out = {}
            for key in f.keys():
                sl = f.get_slice(key)
                out[key] = LazyTensor(tuple(sl.get_shape()), SAFETENSORS_DTYPES[sl.get_dtype()],
                                      _safetensors_loader(path, key))
        data_bytes = sum(t.nbytes for t in out.values())
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: missing weight file") from None
    except (SafetensorError, OSError, ValueError, KeyError, struct.error) as e:
        raise Eagle3Error(f"{path}: corrupt or truncated safetensors file ({e})") from None
    if size < 8 + header_len + data_bytes:
        raise Eagle3Error(f"{path}: corrupt or truncated safetensors file (shorter than its header says)")
    return out


def _safetensors_loader(path: str, key: str):
    def load() -> torch.Tensor:
        try:
            with safe_open(path, framework="pt") as f:
                return f.get_tensor(key)
        except (SafetensorError, OSError) as e:
            raise Eagle3Error(f"{path}: cannot read tensor {key!r} ({e})") from None
    return load


def _open_pickle(path: str) -> dict[str, LazyTensor]:
    try:
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:  # legacy (non-zip) pickles cannot be memory-mapped
            if "mmap" not in str(e):
                raise
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: missing weight file") from None
    except pickle.UnpicklingError as e:
        raise Eagle3Error(f"{path}: refused to load: the pickle holds more than tensors and could run code "
                          f"(only weights_only loading is allowed; {str(e).splitlines()[0]})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise Eagle3Error(f"{path}: corrupt or truncated .bin file ({e})") from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise Eagle3Error(f"{path}: expected a dict of tensors")
    return {k: LazyTensor(tuple(v.shape), v.dtype, lambda v=v: v) for k, v in tensors.items()}


def write_safetensors(path: str, tensors: dict[str, LazyTensor], metadata: dict | None = None,
                      on_tensor: Callable[[str, torch.Tensor], None] | None = None,
                      progress: Callable[[int], None] | None = None) -> None:
    """Write a safetensors file one tensor at a time (``on_tensor`` sees each before it is written)."""
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": _DTYPE_CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, t in tensors.items():
            x = t.load()
            if tuple(x.shape) != t.shape or x.dtype != t.dtype:
                raise Eagle3Error(f"tensor {name!r}: expected {t.shape} {t.dtype}, read {tuple(x.shape)} {x.dtype}")
            if on_tensor is not None:
                on_tensor(name, x)
            f.write(x.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            if progress is not None:
                progress(t.nbytes)
