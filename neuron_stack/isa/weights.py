"""A NEFF's weights as one raw member: ``weights.bin`` (every tensor's bytes, 64-byte aligned) and
``weights.json`` (name, dtype, shape, offset of each), so loading is one mapping and no unpickling.

Writing streams each tensor into the zip (no serialised copy of the model in memory) and pads the
member's local header (an extra field, as Android's ``zipalign``) so its bytes start 64-byte aligned
in the file. Reading then maps the file copy-on-write and the tensors share the mapping
(``torch.frombuffer``): no copy, pages come from the page cache, as ``safetensors`` and
``torch.load(mmap=True)`` do. So replace a loaded NEFF by writing a new file and renaming it (what
``Neff.save`` does), never by overwriting it in place. A member that is not aligned (NEFFs written
before the padding) is read into memory once instead.

The checksum of ``weights.bin`` is xxHash3-128 (``"xxh3_128:<hex>"``, about 10x faster than sha256:
hashing 440 MB of BERT-base took 0.37 s of a 0.7 s load with sha256); a bare hex digest is the
sha256 older NEFFs carry, still checked. NEFFs written before this module (``constants.pt``,
``torch.save``) still load.

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
import io
import json
import mmap
import struct
import zipfile
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    import torch

BIN, INDEX = "weights.bin", "weights.json"
ALIGN = 64
_LOCAL_HEADER = struct.Struct("<4s22xHH")     # signature ... file name length, extra field length
#: The checksum of weights.bin: fast enough to check every load (older NEFFs: a bare sha256 hex digest).
HASH_PREFIX = "xxh3_128:"
_PAD_ID = 0xD935          # the extra-field id zipalign uses for alignment padding
_ZIP64_EXTRA = 20         # the zip64 extra field zipfile adds to a force_zip64 local header


def _hasher(digest: str):
    """(hash object, expected hex) for a checksum as stored in the header."""
    if digest.startswith(HASH_PREFIX):
        return xxhash.xxh3_128(), digest[len(HASH_PREFIX):]
    return hashlib.sha256(), digest


def _aligned_info(z: zipfile.ZipFile) -> zipfile.ZipInfo:
    """A ZipInfo for weights.bin whose padding extra field puts the member's first byte on ALIGN."""
    info = zipfile.ZipInfo(BIN)
    start = z.start_dir + _LOCAL_HEADER.size + len(BIN.encode()) + _ZIP64_EXTRA
    pad = -(start + 4) % ALIGN                 # 4: the padding field's own id and length
    info.extra = struct.pack("<HH", _PAD_ID, pad) + b"\0" * pad
    return info


class WeightsError(ValueError):
    """The weights member does not match its index or checksum (the caller names the file)."""


def write_weights(z: zipfile.ZipFile, constants: dict[str, torch.Tensor]) -> tuple[bytes, str]:
    """Stream ``constants`` into ``z`` as ``weights.bin``; returns ``(weights.json bytes, its checksum)``."""
    import torch  # here, not at import: reading a NEFF's header and program needs no torch (tools/capture.py)

    h = xxhash.xxh3_128()
    entries, offset = [], 0
    with z.open(_aligned_info(z), "w", force_zip64=True) as out:
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
    return json.dumps(entries).encode(), HASH_PREFIX + h.hexdigest()


def _member_view(fileobj, info: zipfile.ZipInfo):
    """The stored bytes of ``info`` straight from the file, no CRC pass (the checksum checks): a
    copy-on-write mapping when they start aligned in a real file, else one copy in memory."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise WeightsError("weights.bin is compressed")
    fileobj.seek(info.header_offset)
    sig, n, e = _LOCAL_HEADER.unpack(fileobj.read(_LOCAL_HEADER.size))
    if sig != b"PK\x03\x04":
        raise WeightsError("weights.bin has no local header")
    start, size = info.header_offset + _LOCAL_HEADER.size + n + e, info.file_size
    if fileobj.seek(0, io.SEEK_END) < start + size:
        raise WeightsError("weights.bin is truncated")
    try:
        fd = fileobj.fileno() if start % ALIGN == 0 and size else None
    except (AttributeError, io.UnsupportedOperation):   # an in-memory archive
        fd = None
    if fd is not None:
        return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_COPY))[start:start + size]
    fileobj.seek(start)
    buf = bytearray(size)
    if fileobj.readinto(buf) != size:
        raise WeightsError("weights.bin is truncated")
    return buf


def read_weights(fileobj, z: zipfile.ZipFile, index: bytes, digest: str) -> dict[str, torch.Tensor]:
    """The tensors of ``weights.bin`` (checked against ``digest``) as ``weights.json`` lays them out."""
    import torch

    buf = _member_view(fileobj, z.getinfo(BIN))
    h, want = _hasher(digest)
    h.update(buf)
    if h.hexdigest() != want:
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
