"""Vectorised field parsing: numbers, hex categories and string hashes of many fields at once.

Every function here takes a whole block's fields at once, as a byte buffer and int64
``start`` / ``end`` offsets (one pair per field, ``end`` exclusive), and returns one
int64 value per field. The formats' fast paths (:mod:`bagpipe.preprocess.criteo`,
:mod:`~bagpipe.preprocess.csv`) are built from them; the formats' exact line parsers
are their specification.

* :func:`parse_decimals`: ``-?[0-9]{1,8}`` -> int64 (empty -> 0), or None for the block.
* :func:`parse_hex_keys`: ``[0-9a-fA-F]{1,8}`` -> its value (empty -> :data:`MISSING_KEY`),
  or None for the block.
* :func:`fnv1a_keys`: any bytes -> 63-bit FNV-1a (empty -> :data:`MISSING_KEY`); never
  declines. :func:`fnv1a_key` is its one-value reference.

Digits are converted SWAR-style ("SIMD within a register"): a field of up to 8 bytes is
read as one little-endian uint64 word (:func:`words`: a byte-strided view, so word
``i`` is bytes ``i .. i+7``; :func:`padded` appends 8 zero bytes so every read is in
bounds), right-aligned and left-filled with ASCII ``'0'``, checked byte-wise with
carry-free add/mask tricks and combined with three multiply-shift-mask steps. The work
runs in chunks of 32K words (three uint64 scratch buffers of 256 KiB: cache-sized) so
the temporaries stay in cache. numpy releases the GIL in these loops, so blocks parse in
parallel on threads.
"""

from __future__ import annotations

import numpy as np

MISSING_KEY = -1  # the key of an empty (missing) categorical value

_U = np.uint64
_CHUNK = 1 << 15
_H = _U(0x8080808080808080)
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_ONE_PER_BYTE = _U(0x0101010101010101)
_CASE_BIT = _U(0x2020202020202020)
_ASCII_ZEROS = 0x3030303030303030


def _ge_const(lo: int) -> np.uint64:
    # x + (0x80 - lo) per byte sets the byte's high bit iff x >= lo (for x < 0x80).
    return _U((0x80 - lo) * 0x0101010101010101)


_GE_0 = _ge_const(0x30)
_GE_COLON = _ge_const(0x3A)
_GE_a = _ge_const(0x61)
_GE_g = _ge_const(0x67)
# For a field of L <= 8 bytes read as a little-endian word w: keep its L bytes, move
# them to the top (the last character is the least significant digit) and fill the
# bottom with ASCII '0', so "1f" and "0000001f" give the same word.
_KEEP = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
_SHIFT = np.array([0] + [8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)
_FILL = np.array([_ASCII_ZEROS & ((1 << (8 * (8 - n))) - 1) for n in range(9)], dtype=np.uint64)


def padded(data: bytes) -> np.ndarray:
    """``data`` as uint8 with 8 zero bytes appended (so any 8-byte word read is in bounds)."""
    arr = np.empty(len(data) + 8, dtype=np.uint8)
    arr[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    arr[len(data) :] = 0
    return arr


def words(arr: np.ndarray) -> np.ndarray:
    """An (unaligned) uint64 view of ``arr`` with a stride of one byte: ``words(a)[i]``
    is the little-endian word of bytes ``a[i:i+8]``."""
    return np.ndarray(shape=(len(arr) - 7,), dtype="<u8", buffer=arr, strides=(1,))


def _aligned_words(wview: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    w = wview[start]
    w &= _KEEP[length]
    w <<= _SHIFT[length]
    w |= _FILL[length]
    return w


class _Scratch:
    """Three reusable uint64 buffers of one chunk (each call makes its own: thread-safe)."""

    def __init__(self) -> None:
        self.a = np.empty(_CHUNK, dtype=np.uint64)
        self.b = np.empty(_CHUNK, dtype=np.uint64)
        self.c = np.empty(_CHUNK, dtype=np.uint64)

    def get(self, k: int):
        return self.a[:k], self.b[:k], self.c[:k]


def _digit_bits(x: np.ndarray, A: np.ndarray, B: np.ndarray) -> bool:
    """False if a byte of x is not ASCII; else A holds, per byte, its high bit set iff
    the byte is '0'..'9' (B is scratch)."""
    np.bitwise_and(x, _H, out=A)
    if A.any():
        return False
    np.add(x, _GE_0, out=A)
    np.add(x, _GE_COLON, out=B)
    np.invert(B, out=B)
    np.bitwise_and(A, B, out=A)
    return True


def _all_ascii_digits(x: np.ndarray, A: np.ndarray, B: np.ndarray) -> bool:
    """Every byte of every word of x is '0'..'9'."""
    if not _digit_bits(x, A, B):
        return False
    np.bitwise_and(A, _H, out=A)
    return bool((A == _H).all())


def _all_ascii_hex(x: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray) -> bool:
    """Every byte of every word of x is '0'..'9', 'a'..'f' or 'A'..'F'."""
    if not _digit_bits(x, A, B):  # digits
        return False
    np.bitwise_or(x, _CASE_BIT, out=C)
    np.add(C, _GE_a, out=B)
    np.add(C, _GE_g, out=C)
    np.invert(C, out=C)
    np.bitwise_and(B, C, out=B)  # letters
    np.bitwise_or(A, B, out=A)
    np.bitwise_and(A, _H, out=A)
    return bool((A == _H).all())


def _combine_bytes(v: np.ndarray, B: np.ndarray, base: int) -> None:
    """In place: 8 digits of ``base`` (10 or 16), one per byte, most significant first
    (byte 0), -> their value. Three multiply-shift-mask steps (pairs, quads, all)."""
    np.multiply(v, _U(base * 256 + 1), out=v)
    np.right_shift(v, _U(8), out=v)
    np.bitwise_and(v, _U(0x00FF00FF00FF00FF), out=v)
    np.multiply(v, _U(base * base * 65536 + 1), out=v)
    np.right_shift(v, _U(16), out=v)
    np.bitwise_and(v, _U(0x0000FFFF0000FFFF), out=v)
    np.multiply(v, _U((base**4 << 32) + 1), out=v)
    np.right_shift(v, _U(32), out=v)


def parse_decimals(arr: np.ndarray, wview: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields ``arr[start:end]`` as int64: ``-?[0-9]{1,8}``, empty -> 0.

    Returns None if any field is anything else (including longer numbers, which the
    exact line parser then handles)."""
    length = end - start
    m = len(start)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    neg = arr[start] == 0x2D
    neg &= length > 0
    dstart = start + neg
    dlen = length - neg
    if int(dlen.max()) > 8 or (neg & (dlen == 0)).any():
        return None
    out = _aligned_words(wview, dstart, dlen)
    sc = _Scratch()
    for s in range(0, m, _CHUNK):
        x = out[s : s + _CHUNK]
        A, B, _ = sc.get(len(x))
        if not _all_ascii_digits(x, A, B):
            return None
        np.subtract(x, _U(_ASCII_ZEROS), out=x)
        _combine_bytes(x, B, 10)
    val = out.view(np.int64)
    np.negative(val, out=val, where=neg)
    return val


def parse_hex_keys(wview: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields ``[start:end)`` as int64 keys: ``[0-9a-fA-F]{1,8}`` -> its value, empty ->
    :data:`MISSING_KEY`. Returns None for anything else (longer values included)."""
    length = end - start
    m = len(start)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    empty = length == 0
    full = length == 8
    if bool((empty | full).all()):  # the usual case: 8 hex digits or nothing
        out = wview[start]
        np.copyto(out, _U(_ASCII_ZEROS), where=empty)
    elif int(length.max()) > 8:
        return None
    else:
        out = _aligned_words(wview, start, length)
    sc = _Scratch()
    for s in range(0, m, _CHUNK):
        x = out[s : s + _CHUNK]
        A, B, C = sc.get(len(x))
        if not _all_ascii_hex(x, A, B, C):
            return None
        # nibble = (c & 0xF) + 9 * (c has bit 6, i.e. is a letter)
        np.right_shift(x, _U(6), out=A)
        np.bitwise_and(A, _ONE_PER_BYTE, out=A)
        np.multiply(A, _U(9), out=A)
        np.bitwise_and(x, _LOW_NIBBLES, out=x)
        np.add(x, A, out=x)
        _combine_bytes(x, B, 16)
    keys = out.view(np.int64)
    np.copyto(keys, MISSING_KEY, where=empty)
    return keys


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK63 = (1 << 63) - 1


def fnv1a_keys(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Keys of string fields ``data[start:end]``: 64-bit FNV-1a of the bytes with the top
    bit cleared; an empty field is :data:`MISSING_KEY`. Vectorised over fields."""
    length = end - start
    h = np.full(len(start), _FNV_OFFSET, dtype=np.uint64)
    act = np.flatnonzero(length > 0)
    k = 0
    prime = _U(_FNV_PRIME)
    while act.size:
        b = data[start[act] + k].astype(np.uint64)
        hk = h[act]
        hk ^= b
        hk *= prime
        h[act] = hk
        k += 1
        act = act[length[act] > k]
    keys = (h & _U(_MASK63)).view(np.int64)
    keys[length == 0] = MISSING_KEY
    return keys


def fnv1a_key(value: bytes) -> int:
    """The key of one string value (the reference of :func:`fnv1a_keys`)."""
    if not value:
        return MISSING_KEY
    h = _FNV_OFFSET
    for b in value:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h & _MASK63
