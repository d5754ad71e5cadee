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
from typing import Callable

import torch
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
            tensors.update(opener(_inside(folder, shard, index)))
        return tensors
    if os.path.exists(binary):
        return _open_pickle(binary)
    raise Eagle3Error(f"{folder}: no weights found (model.safetensors, model.safetensors.index.json "
                      f"or pytorch_model.bin)")


def _inside(folder: str, name, index: str) -> str:
    """``folder/name`` for a shard file the index names; a name leading anywhere else is refused."""
    if not isinstance(name, str) or os.path.isabs(name) or os.path.normpath(name).split(os.sep)[0] == os.pardir:
        raise Eagle3Error(f"{index}: shard {name!r} is outside the checkpoint folder")
    return os.path.join(folder, name)


def _open_safetensors(path: str) -> dict[str, LazyTensor]:
    """Parse the header only; each tensor is later read straight from its byte range."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            if header_len > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(header_len))
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: missing weight file") from None
    except (OSError, ValueError, struct.error) as e:
        raise Eagle3Error(f"{path}: corrupt or truncated safetensors file ({e})") from None
    data_start = 8 + header_len
    out = {}
    try:
        for key, info in header.items():
            if key == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            t = LazyTensor(tuple(info["shape"]), SAFETENSORS_DTYPES[info["dtype"]],
                           _range_loader(path, data_start + begin, end - begin, info))
            if end - begin != t.nbytes or data_start + end > size:
                raise ValueError(f"tensor {key!r} lies outside the file or has the wrong size")
            out[key] = t
    except (KeyError, TypeError, ValueError) as e:
        raise Eagle3Error(f"{path}: corrupt or truncated safetensors file ({e})") from None
    return out


def _range_loader(path: str, offset: int, nbytes: int, info: dict):
    def load() -> torch.Tensor:
        buffer = bytearray(nbytes)
        with open(path, "rb") as f:
            f.seek(offset)
            if f.readinto(buffer) != nbytes:
                raise Eagle3Error(f"{path}: truncated while reading a tensor")
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        if nbytes == 0:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(buffer, dtype=dtype).reshape(info["shape"])
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


def all_finite(x: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """No NaN or Inf in ``x``, checked in chunks (``torch.isfinite`` on a whole tensor costs ~2x its size)."""
    if not x.is_floating_point():
        return True
    return all(bool(torch.isfinite(part).all()) for part in x.reshape(-1).split(chunk))


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
