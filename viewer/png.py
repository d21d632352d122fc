"""PNG files with zlib and struct only (no pillow): 8-bit grey, RGB and RGBA.

write_png saves what the viewer renders; read_png reads those files back (and any other
non-interlaced 8-bit PNG), which the tests use to load their reference images.
"""
from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from wgpu_ad.errors import WgpuAdError

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOR_TYPES = {1: 0, 3: 2, 4: 6}     # channels -> PNG colour type
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> channels


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(image: np.ndarray, level: int = 6) -> bytes:
    """The PNG bytes of an (h, w), (h, w, 3) or (h, w, 4) uint8 array, first row at the top."""
    img = np.asarray(image)
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3 or img.shape[2] not in _COLOR_TYPES or img.dtype != np.uint8:
        raise WgpuAdError(f"write_png: expected a uint8 array of shape (h, w), (h, w, 3) or (h, w, 4); "
                          f"got {img.dtype} {img.shape}")
    h, w, c = img.shape
    rows = np.empty((h, 1 + w * c), dtype=np.uint8)
    rows[:, 0] = 0  # filter type None on every row: simple, and zlib still compresses flat areas well
    rows[:, 1:] = img.reshape(h, w * c)
    header = struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPES[c], 0, 0, 0)
    return (_SIGNATURE + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)) + _chunk(b"IEND", b""))


def write_png(path: str | os.PathLike, image: np.ndarray) -> None:
    """Save an (h, w[, 3|4]) uint8 image; the folder is created if needed."""
    data = encode_png(image)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    p = a.astype(np.int16) + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c)).astype(np.uint8)


def _unfilter(raw: bytes, h: int, stride: int, bpp: int) -> np.ndarray:
    data = np.frombuffer(raw, dtype=np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        ftype, line = data[y, 0], data[y, 1:].copy()
        if ftype == 1:      # Sub: left neighbour, sequential within the row
            for x in range(bpp, stride):
                line[x] = (int(line[x]) + int(line[x - bpp])) & 0xFF
        elif ftype == 2:    # Up
            line = (line.astype(np.uint16) + prev).astype(np.uint8)
        elif ftype in (3, 4):  # Average / Paeth need the reconstructed left byte: per byte
            for x in range(stride):
                left = int(line[x - bpp]) if x >= bpp else 0
                up = int(prev[x])
                if ftype == 3:
                    pred = (left + up) // 2
                else:
                    ul = int(prev[x - bpp]) if x >= bpp else 0
                    pred = int(_paeth(np.uint8(left), np.uint8(up), np.uint8(ul)))
                line[x] = (int(line[x]) + pred) & 0xFF
        elif ftype != 0:
            raise WgpuAdError(f"read_png: unknown filter type {ftype} in row {y}")
        out[y] = line
        prev = line
    return out


def decode_png(data: bytes) -> np.ndarray:
    """An (h, w, channels) uint8 array from 8-bit non-interlaced PNG bytes."""
    if data[:8] != _SIGNATURE:
        raise WgpuAdError("read_png: not a PNG file (bad signature)")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if tag == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if header is None:
        raise WgpuAdError("read_png: no IHDR chunk")
    w, h, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype not in _CHANNELS or interlace:
        raise WgpuAdError(f"read_png: only 8-bit, non-interlaced grey/RGB/RGBA PNGs are supported "
                          f"(got bit depth {depth}, colour type {ctype}, interlace {interlace})")
    c = _CHANNELS[ctype]
    pixels = _unfilter(zlib.decompress(b"".join(idat)), h, w * c, c)
    return pixels.reshape(h, w, c)


def read_png(path: str | os.PathLike) -> np.ndarray:
    with open(path, "rb") as f:
        return decode_png(f.read())
