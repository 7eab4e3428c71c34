"""Property tests of ``bagpipe preprocess``: generated lines with random empty fields,
negative and long integers, hex categories of every length and case, and corruptions
(wrong field count, non-numeric integer, non-hex category, bad label, bad hour / price /
sequence item, empty line), written with LF or CRLF endings, with or without a final
newline, plain or gzip, and read with block sizes from 256 bytes to 64 KiB (so the
vectorised fast path, the bisection of a block holding a bad line and the exact
line-by-line parser all run).

The expectation comes from a tiny pure-Python reference parser written here from the
format description, independent of bagpipe's parsers:

* every valid line round-trips exactly (label, float32 dense value, categorical key /
  hour features / sequence items) and carries its 1-based line number;
* every corrupt line is reported with its own line number, no other line is;
* through the whole pipeline (``run_preprocess`` + reading the shards back and mapping
  ids back to keys through the saved vocabulary) the same holds, ``--on-error skip``
  counts exactly the corrupt lines and ``--on-error fail`` stops at the first one.
"""

from __future__ import annotations

import datetime
import gzip
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe.data.shards import Dataset
from bagpipe.errors import ParseError
from bagpipe.preprocess.avazu import AvazuFormat
from bagpipe.preprocess.criteo import CriteoFormat
from bagpipe.preprocess.inputs import parse_file
from bagpipe.preprocess.options import Options
from bagpipe.preprocess.run import run_preprocess
from bagpipe.preprocess.taobao import TaobaoFormat

pytestmark = pytest.mark.unit

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------------------------
# reference parsers (plain Python, from the format descriptions)
# ---------------------------------------------------------------------------------

INT_RE = re.compile(r"-?[0-9]+")
HEX_RE = re.compile(r"[0-9a-fA-F]{1,16}")
NUM_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def f32_log1p(x: float) -> np.float32:
    return np.float32(np.log1p(np.float64(max(x, 0))))


def ref_criteo(line: str, labelled: bool):
    """(label, [13 float32], [26 keys]) or None for a bad line."""
    if line.endswith("\r"):
        line = line[:-1]
    f = line.split("\t")
    if len(f) != (40 if labelled else 39):
        return None
    label = 0
    if labelled:
        if f[0] not in ("0", "1"):
            return None
        label = int(f[0])
        f = f[1:]
    dense = []
    for v in f[:13]:
        if v == "":
            dense.append(f32_log1p(0))
        elif INT_RE.fullmatch(v) and -(2**63) <= int(v) < 2**63:
            dense.append(f32_log1p(int(v)))
        else:
            return None
    keys = []
    for v in f[13:]:
        if v == "":
            keys.append(-1)
        elif HEX_RE.fullmatch(v) and int(v, 16) < 2**63:
            keys.append(int(v, 16))
        else:
            return None
    return label, dense, keys


def fnv(value: str) -> int:
    if value == "":
        return -1
    h = 0xCBF29CE484222325
    for b in value.encode():
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h % (1 << 63)


AVAZU_COLUMNS = (
    "id click hour C1 banner_pos site_id site_domain site_category app_id app_domain app_category "
    "device_id device_ip device_model device_type device_conn_type C14 C15 C16 C17 C18 C19 C20 C21"
).split()
AVAZU_KEYS = [c for c in AVAZU_COLUMNS if c not in ("id", "click", "hour")]


def ref_avazu(line: str):
    """(label, [hour_of_day, day_of_week], [21 keys]) or None."""
    if line.endswith("\r"):
        line = line[:-1]
    f = line.split(",")
    if len(f) != 24:
        return None
    row = dict(zip(AVAZU_COLUMNS, f))
    if row["click"] not in ("0", "1"):
        return None
    h = row["hour"]
    if not re.fullmatch(r"[0-9]{8}", h) or int(h[6:]) > 23:
        return None
    try:
        day = datetime.date(2000 + int(h[:2]), int(h[2:4]), int(h[4:6]))
    except ValueError:
        return None
    return int(row["click"]), [int(h[6:]), day.weekday()], [fnv(row[c]) for c in AVAZU_KEYS]


TAOBAO_COLUMNS = (
    "clk time_stamp userid adgroup_id pid cate_id campaign_id customer brand price cms_segid cms_group_id "
    "final_gender_code age_level pvalue_level shopping_level occupation new_user_class_level click_sequence"
).split()
TAOBAO_KEYS = [c for c in TAOBAO_COLUMNS if c not in ("clk", "time_stamp", "price", "click_sequence")]


def ref_taobao(line: str):
    """(label, price float32, [15 keys], [sequence keys]) or None."""
    if line.endswith("\r"):
        line = line[:-1]
    f = line.split(",")
    if len(f) != 19:
        return None
    row = dict(zip(TAOBAO_COLUMNS, f))
    if row["clk"] not in ("0", "1"):
        return None
    p = row["price"]
    if p == "":
        price = 0.0
    elif NUM_RE.fullmatch(p) and math.isfinite(float(p)):
        price = float(p)
    else:
        return None
    seq = row["click_sequence"].split("^") if row["click_sequence"] else []
    if any(x == "" for x in seq):
        return None
    return int(row["clk"]), f32_log1p(price), [fnv(row[c]) for c in TAOBAO_KEYS], [fnv(x) for x in seq]


# ---------------------------------------------------------------------------------
# line generators
# ---------------------------------------------------------------------------------

int_field = st.one_of(
    st.just(""),
    st.integers(-5, 50).map(str),
    st.integers(-(10**8) + 1, 10**8 - 1).map(str),  # what the fast path takes
    st.integers(-(2**63), 2**63 - 1).map(str),  # long: the exact parser's job
    st.integers(0, 999).map(lambda v: f"00{v}"),  # leading zeros
)


@st.composite
def hex_field(draw):
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return ""
    if kind <= 6:
        return f"{draw(st.integers(0, 2**32 - 1)):08x}"
    n = draw(st.integers(1, 16))
    v = draw(st.integers(0, min(16**n, 2**63) - 1))
    s = f"{v:0{n}x}"
    return s.upper() if draw(st.booleans()) else s


BAD_INTS = [
    "1a",
    "+5",
    " 7",
    "8 ",
    "1.5",
    "--1",
    "-",
    "0x10",
    "\u0663",
    "9223372036854775808",
    "-9223372036854775809",
    "1e3",
    "\x00",
]
BAD_HEX = ["xyz", "0x1f", "g0000000", "12345678 ", "1234567890abcdef0", "8000000000000000", "-1", "\u00e9", "ab\rcd"]
BAD_LABELS = ["2", "", "01", " 1", "-1", "1.0", "x"]


plain_int_field = st.one_of(st.just(""), st.integers(-5, 50).map(str), st.integers(-(10**8) + 1, 10**8 - 1).map(str))
plain_hex_field = st.one_of(
    st.just(""),
    st.integers(0, 2**32 - 1).map(lambda v: f"{v:08x}"),
    st.integers(0, 2**32 - 1).map(lambda v: f"{v:08X}"),
)


# the share of corrupt lines, drawn per example: a few scattered bad lines let the
# fast path take the clean parts of a block; many bad lines push work to the line parser
bad_rate = st.sampled_from([0.0, 0.01, 0.05, 0.3])


def corruption(draw, rate: float, kinds: list[str]) -> str:
    return draw(st.sampled_from(kinds)) if draw(st.floats(0, 1)) < rate else "ok"


@st.composite
def criteo_line(draw, labelled: bool, rate: float = 0.05):
    # most lines hold what the published data holds (the vectorised fast path takes
    # them); one in five has long integers / short or long hex values as well
    exotic = draw(st.integers(0, 4)) == 0
    ints, hexes = (int_field, hex_field()) if exotic else (plain_int_field, plain_hex_field)
    fields = ([draw(st.sampled_from(["0", "1"]))] if labelled else []) + [draw(ints) for _ in range(13)]
    fields += [draw(hexes) for _ in range(26)]
    o = 1 if labelled else 0
    kind = corruption(draw, rate, ["count", "int", "cat", "label", "empty"])
    if kind == "count":
        if draw(st.booleans()):
            del fields[draw(st.integers(0, len(fields) - 1))]
        else:
            fields.insert(draw(st.integers(0, len(fields))), draw(hex_field()))
    elif kind == "int":
        fields[o + draw(st.integers(0, 12))] = draw(st.sampled_from(BAD_INTS))
    elif kind == "cat":
        fields[o + 13 + draw(st.integers(0, 25))] = draw(st.sampled_from(BAD_HEX))
    elif kind == "label" and labelled:
        fields[0] = draw(st.sampled_from(BAD_LABELS))
    elif kind == "empty":
        return ""
    return "\t".join(fields)


def write(
    tmp: Path, lines: list[str], crlf: bool, final_newline: bool, gz: bool, header: str | None = None
) -> tuple[Path, list[str]]:
    """Write the lines; return the path and the lines as a reader sees them."""
    nl = "\r\n" if crlf else "\n"
    body = nl.join(lines) + (nl if final_newline else "")
    if header is not None:
        body = header + nl + body
    data = body.encode("utf-8")
    path = tmp / ("in.txt.gz" if gz else "in.txt")
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    seen = body.split("\n")
    if body.endswith("\n"):
        seen.pop()
    return path, seen


file_options = st.fixed_dictionaries(
    {
        "crlf": st.booleans(),
        "final_newline": st.booleans(),
        "gz": st.booleans(),
        "block_bytes": st.sampled_from([256, 1024, 4096, 1 << 16]),
    }
)

# ---------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=80)
@given(data=st.data(), labelled=st.booleans(), opts=file_options)
def test_criteo_lines_round_trip_and_bad_lines_are_named(data, labelled, opts):
    lines = data.draw(st.lists(criteo_line(labelled, data.draw(bad_rate)), min_size=1, max_size=300))
    lines[0] = lines[0] or "\t".join(["1"] * (40 if labelled else 39))  # not an empty file
    with tempfile.TemporaryDirectory() as d:
        path, seen = write(Path(d), lines, opts["crlf"], opts["final_newline"], opts["gz"])
        raw, dense, line_numbers, bad = parse_file(CriteoFormat(labelled=labelled), path, opts["block_bytes"])
    ref = [ref_criteo(ln, labelled) for ln in seen]
    good = [i + 1 for i, r in enumerate(ref) if r is not None]
    assert [b[0] for b in bad] == [i + 1 for i, r in enumerate(ref) if r is None]
    assert line_numbers.tolist() == good
    ok = [r for r in ref if r is not None]
    assert raw.labels.tolist() == [r[0] for r in ok]
    np.testing.assert_array_equal(dense, np.array([r[1] for r in ok], dtype=np.float32).reshape(len(ok), 13))
    np.testing.assert_array_equal(raw.keys.T, np.array([r[2] for r in ok], dtype=np.int64).reshape(len(ok), 26))


def keys_back(out: Path, split: str, names: list[str]) -> np.ndarray:
    """The categorical keys of a split, recovered from ids through OUT/vocab."""
    ds = Dataset(out)
    sparse = np.concatenate([np.asarray(ds.shard(split, i).sparse) for i in range(len(ds.shard_sizes(split)))])
    cols = []
    for j, name in enumerate(names):
        kept = np.load(out / "vocab" / f"{name}.keys.npy")  # min-count 1: every key kept
        ids = sparse[:, j].astype(np.int64)
        assert (ids >= 1).all()  # all lines are train lines: no id 0
        cols.append(kept[ids - 1])
    return np.stack(cols, axis=1) if cols else np.zeros((len(sparse), 0), np.int64)


@settings(SETTINGS, max_examples=25)
@given(data=st.data(), opts=file_options, workers=st.integers(1, 3))
def test_criteo_pipeline_round_trip_skip_and_fail(data, opts, workers):
    lines = data.draw(st.lists(criteo_line(True, data.draw(bad_rate)), min_size=1, max_size=200))
    lines[0] = "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["0000abcd"] * 26)
    ref = None
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        path, seen = write(d, lines, opts["crlf"], opts["final_newline"], opts["gz"])
        ref = [ref_criteo(ln, True) for ln in seen]
        bad = [i + 1 for i, r in enumerate(ref) if r is None]
        ok = [r for r in ref if r is not None]
        block = max(1024, opts["block_bytes"])
        res = run_preprocess(
            CriteoFormat(),
            Options(
                out=str(d / "o"),
                inputs=[str(path)],
                split=1.0,
                on_error="skip",
                workers=workers,
                block_bytes=block,
                rows_per_shard=64,
            ),
        )
        assert res.skipped == len(bad)
        assert Dataset(d / "o").meta.source["skipped_lines"] == len(bad)
        ds = Dataset(d / "o")
        labels = np.concatenate([np.asarray(ds.shard("train", i).labels) for i in range(len(ds.shard_sizes("train")))])
        dense = np.concatenate([np.asarray(ds.shard("train", i).dense) for i in range(len(ds.shard_sizes("train")))])
        assert labels.tolist() == [r[0] for r in ok]
        np.testing.assert_array_equal(dense, np.array([r[1] for r in ok], dtype=np.float32))
        np.testing.assert_array_equal(keys_back(d / "o", "train", [f"C{i}" for i in range(1, 27)]), [r[2] for r in ok])
        if bad:
            with pytest.raises(ParseError) as e:
                run_preprocess(
                    CriteoFormat(), Options(out=str(d / "f"), inputs=[str(path)], workers=workers, block_bytes=block)
                )
            assert e.value.line == bad[0]
            assert e.value.path == str(path)
            assert not (d / "f" / "meta.json").exists()


@st.composite
def avazu_line(draw, rate: float = 0.05):
    day = draw(st.dates(datetime.date(2000, 1, 1), datetime.date(2099, 12, 31)))
    hour = f"{day:%y%m%d}{draw(st.integers(0, 23)):02d}"
    text = st.text(alphabet="0123456789abcdef-", max_size=12)
    fields = [str(draw(st.integers(0, 2**64))), draw(st.sampled_from(["0", "1"])), hour]
    fields += [draw(text) for _ in AVAZU_KEYS]
    kind = corruption(draw, rate, ["count", "hour", "hour", "hour", "label"])
    if kind == "count":
        fields.append("x")
    elif kind == "hour":
        yy, mm, dd, hh = hour[:2], hour[2:4], hour[4:6], hour[6:]
        fields[2] = draw(
            st.sampled_from(
                [
                    f"{yy}{mm}{dd}{draw(st.integers(24, 99))}",  # no such hour
                    f"{yy}{draw(st.sampled_from(['00', '13', '99']))}{dd}{hh}",  # no such month
                    f"{yy}{mm}{draw(st.sampled_from(['00', '32', '99']))}{hh}",  # no such day
                    f"{yy}0230{hh}",  # no such date
                    f"{(draw(st.integers(1, 99)) * 4 + 1) % 100:02d}0229{hh}",  # not a leap year (but 2000 is)
                    hour[:7],
                    hour + "0",
                    "1410x100",
                    "-1410210",
                    "",
                ]
            )
        )
    elif kind == "label":
        fields[1] = draw(st.sampled_from(BAD_LABELS))
    return ",".join(fields)


@settings(SETTINGS, max_examples=40)
@given(data=st.data(), opts=file_options, header=st.booleans())
def test_avazu_lines_round_trip(data, opts, header):
    lines = data.draw(st.lists(avazu_line(data.draw(bad_rate)), min_size=1, max_size=150))
    with tempfile.TemporaryDirectory() as d:
        path, seen = write(
            Path(d), lines, opts["crlf"], opts["final_newline"], opts["gz"], ",".join(AVAZU_COLUMNS) if header else None
        )
        raw, _, line_numbers, bad = parse_file(AvazuFormat(), path, opts["block_bytes"])
    if header:
        seen = seen[1:]
    ref = [ref_avazu(ln) for ln in seen]
    off = 2 if header else 1  # the header is line 1
    assert [b[0] for b in bad] == [i + off for i, r in enumerate(ref) if r is None]
    assert line_numbers.tolist() == [i + off for i, r in enumerate(ref) if r is not None]
    ok = [r for r in ref if r is not None]
    assert raw.labels.tolist() == [r[0] for r in ok]
    np.testing.assert_array_equal(raw.fixed, np.array([r[1] for r in ok], dtype=np.int64).reshape(len(ok), 2))
    np.testing.assert_array_equal(raw.keys.T, np.array([r[2] for r in ok], dtype=np.int64).reshape(len(ok), 21))


@st.composite
def taobao_line(draw, rate: float = 0.05):
    num = st.one_of(st.just(""), st.integers(0, 10**9).map(str))
    price = draw(
        st.one_of(
            st.just(""),
            st.floats(0, 1e9, allow_nan=False).map(repr),
            st.decimals(0, 10**6, places=2).map(str),
            st.sampled_from(["5.", ".5", "+3", "-2.5", "1e3", "1E-2"]),
        )
    )
    item = st.text(alphabet="0123456789ab", min_size=1, max_size=8)
    seq = "^".join(draw(st.lists(item, max_size=6)))
    fields = [draw(st.sampled_from(["0", "1"])), "2017-05-06 00:00:00"]
    fields += [draw(num) for _ in range(7)] + [price] + [draw(num) for _ in range(8)] + [seq]
    kind = corruption(draw, rate, ["count", "price", "seq", "label"])
    if kind == "count":
        fields.pop()
    elif kind == "price":
        fields[9] = draw(st.sampled_from(["abc", "1,5", "nan", "inf", "1e999", "1.2.3", " 4", "0x1"]))
    elif kind == "seq":
        fields[18] = draw(st.sampled_from(["^", "a^^b", "^a", "a^"]))
    elif kind == "label":
        fields[0] = draw(st.sampled_from(BAD_LABELS))
    return ",".join(fields)


@settings(SETTINGS, max_examples=40)
@given(data=st.data(), opts=file_options)
def test_taobao_lines_round_trip(data, opts):
    lines = data.draw(st.lists(taobao_line(data.draw(bad_rate)), min_size=1, max_size=150))
    with tempfile.TemporaryDirectory() as d:
        path, seen = write(Path(d), lines, opts["crlf"], opts["final_newline"], opts["gz"], ",".join(TAOBAO_COLUMNS))
        raw, dense, line_numbers, bad = parse_file(TaobaoFormat(), path, opts["block_bytes"])
    ref = [ref_taobao(ln) for ln in seen[1:]]
    assert [b[0] for b in bad] == [i + 2 for i, r in enumerate(ref) if r is None]
    assert line_numbers.tolist() == [i + 2 for i, r in enumerate(ref) if r is not None]
    ok = [r for r in ref if r is not None]
    assert raw.labels.tolist() == [r[0] for r in ok]
    np.testing.assert_array_equal(dense[:, 0], np.array([r[1] for r in ok], dtype=np.float32))
    np.testing.assert_array_equal(raw.keys.T, np.array([r[2] for r in ok], dtype=np.int64).reshape(len(ok), 15))
    values, lengths = raw.seqs[0]
    assert lengths.tolist() == [len(r[3]) for r in ok]
    assert values.tolist() == [k for r in ok for k in r[3]]
