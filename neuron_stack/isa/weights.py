"""A NEFF's weights as one raw member: ``weights.bin`` (every tensor's bytes, 64-byte aligned) and
``weights.json`` (name, dtype, shape, offset of each), so loading is one read and no unpickling.

Writing streams each tensor into the zip (no serialised copy of the model in memory); reading
copies the member once into a buffer the tensors then share (``torch.frombuffer``). NEFFs written
before this module (``constants.pt``, ``torch.save``) still load.

>>> import io, zipfile, torch
>>> buf = io.BytesIO()
>>> with zipfile.ZipFile(buf, "w") as z:
...     index, digest = write_weights(z, {"w": torch.arange(6.0).view(2, 3)})
>>> with zipfile.ZipFile(buf) as z:
...     read_weights(buf, z, index, digest)["w"][1].tolist()
[3.0, 4.0, 5.0]
"""
from __future__ import annotations

import hashlib
import json
import struct
import zipfile

import torch

BIN, INDEX = "weights.bin", "weights.json"
ALIGN = 64
_LOCAL_HEADER = struct.Struct("<4s22xHH")     # signature ... file name length, extra field length


class WeightsError(ValueError):
    """The weights member does not match its index or checksum (the caller names the file)."""


def write_weights(z: zipfile.ZipFile, constants: dict[str, torch.Tensor]) -> tuple[bytes, str]:
    """Stream ``constants`` into ``z`` as ``weights.bin``; returns ``(weights.json bytes, sha256 of the bin)``."""
    h = hashlib.sha256()
    entries, offset = [], 0
    with z.open(zipfile.ZipInfo(BIN), "w", force_zip64=True) as out:
        for name in sorted(constants):
            t = constants[name].detach().contiguous()
            if t.is_meta:   # projection mode: a shape without bytes, loaded back on the meta device
                entries.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                "offset": offset, "nbytes": 0, "meta": True})
                continue
            raw = t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b""
            pad = -offset % ALIGN
            if pad:
                out.write(b"\0" * pad)
                h.update(b"\0" * pad)
                offset += pad
            out.write(raw)
            h.update(raw)
            entries.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "offset": offset, "nbytes": len(raw)})
            offset += len(raw)
    return json.dumps(entries).encode(), h.hexdigest()


def _member_bytes(fileobj, info: zipfile.ZipInfo) -> bytearray:
    """The stored bytes of ``info`` read straight from the file: one copy, no CRC pass (the sha256 checks)."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise WeightsError("weights.bin is compressed")
    fileobj.seek(info.header_offset)
    sig, n, e = _LOCAL_HEADER.unpack(fileobj.read(_LOCAL_HEADER.size))
    if sig != b"PK\x03\x04":
        raise WeightsError("weights.bin has no local header")
    fileobj.seek(info.header_offset + _LOCAL_HEADER.size + n + e)
    buf = bytearray(info.file_size)
    if fileobj.readinto(buf) != info.file_size:
        raise WeightsError("weights.bin is truncated")
    return buf


def read_weights(fileobj, z: zipfile.ZipFile, index: bytes, digest: str) -> dict[str, torch.Tensor]:
    """The tensors of ``weights.bin`` (checked against ``digest``) as ``weights.json`` lays them out."""
    buf = _member_bytes(fileobj, z.getinfo(BIN))
    if hashlib.sha256(buf).hexdigest() != digest:
        raise WeightsError("checksum mismatch in member weights.bin (the file is corrupt)")
    out = {}
    for e in json.loads(index):
        dtype = getattr(torch, str(e["dtype"]), None)
        shape, off, nb = [int(d) for d in e["shape"]], int(e["offset"]), int(e["nbytes"])
        if not isinstance(dtype, torch.dtype) or off < 0 or off + nb > len(buf):
            raise WeightsError(f"weights.json: bad entry for {e.get('name')!r}")
        numel = 1
        for d in shape:
            numel *= d
        if e.get("meta") is True and nb == 0 and all(d >= 0 for d in shape):
            out[e["name"]] = torch.empty(shape, dtype=dtype, device="meta")
            continue
        if numel * dtype.itemsize != nb:
            raise WeightsError(f"weights.json: {e['name']!r} has {nb} bytes for shape {shape}")
        out[e["name"]] = (torch.frombuffer(buf, dtype=dtype, count=numel, offset=off).view(shape) if numel
                          else torch.empty(shape, dtype=dtype))
    return out
