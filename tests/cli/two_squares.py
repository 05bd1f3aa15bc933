"""Writes "a red square.png" and "a blue square.png" (32 x 32, RGB) into the folder given, with
PNG's chunk layout written out here (zlib and CRC-32 from the standard library), so that the CLI
tests' pictures do not depend on remat's own encoder."""
import os
import struct
import sys
import zlib


def png(path, w, h, rgb):
    raw = b"".join(b"\x00" + bytes(rgb) * w for _ in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    open(path, "wb").write(data + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


os.makedirs(sys.argv[1], exist_ok=True)
png(os.path.join(sys.argv[1], "a red square.png"), 32, 32, (220, 20, 20))
png(os.path.join(sys.argv[1], "a blue square.png"), 32, 32, (20, 20, 220))
