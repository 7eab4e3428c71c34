"""``bagpipe preprocess``: raw Criteo / Avazu / Taobao logs -> binary shards."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Convert raw click logs into bagpipe's binary shard format (see docs/preprocessing.md).

Formats:
  criteo   label \\t I1..I13 \\t C1..C26 (Kaggle / Terabyte text; 39 fields with --no-label)
  avazu    the Avazu CSV (id,click,hour,C1,...,C21; header detected, --no-header to refuse it)
  taobao   the Taobao display-ad CSV (clk,...,price,...,click_sequence; header in file)

Splits: --input lines are split by line order, the first --split of them (default 0.9,
or 1.0 when --eval-files is given) to "train", the rest to "eval"; --eval-files go to
"eval" whole. --no-label input (e.g. Kaggle test.txt) goes whole to split "test" with
labels written as 0; preprocess it into its own dataset with --vocab-from.

Categorical values: a vocabulary of the train lines (the default, --min-count 1: every
value seen in train has its own row; values seen fewer than --min-count times and
values never seen share row 0) or hashing (--max-rows-per-table M: id = value % M, as
DLRM's --max-ind-range). The mapping is saved in OUT/vocab; --vocab-from DIR reuses
DIR's, so a validation or test file gets the same ids and table sizes.

Inputs: files, plain or gzip, or streams read once as they come: - (standard input),
/dev/stdin, a named pipe, <(zcat day_0.gz). With a fractional --split (the default 0.9)
a stream's text is kept once beside --out (.OUT.spill-*, removed at the end) to count its
lines first; the dataset is the one the same lines in a file give.

Bad lines (wrong field count, non-numeric integer, non-hex category, label not 0/1, ...)
stop the run with FILE:LINE: problem (--on-error fail, the default) or are skipped and
counted (--on-error skip; the count is printed and stored in meta.json). meta.json is
written last, so an interrupted run never looks like a finished dataset.

Examples:
  bagpipe preprocess criteo --input train.txt --out data/criteo
  bagpipe preprocess criteo --input day_0.gz day_1.gz --eval-files day_23.gz \\
      --max-rows-per-table 10000000 --out data/terabyte
  bagpipe preprocess criteo --input test.txt --no-label --vocab-from data/criteo --out data/criteo-test
  zcat day_0.gz | bagpipe preprocess criteo --input - --split 1 --max-rows-per-table 10000000 --out data/day0
  bagpipe preprocess avazu --input train_head9k.csv --eval-files test_1k.csv --out data/avazu
  bagpipe preprocess avazu --input test_1k.csv --no-header --split 0 --vocab-from data/avazu --out data/avazu-test
  bagpipe preprocess taobao --input train.csv --eval-files valid.csv --min-count 2 --out data/taobao
"""

_FORMAT_HELP = {
    "criteo": """\
Criteo Kaggle / Terabyte text: one line per sample, tab-separated, no header:
  label \\t I1..I13 \\t C1..C26     (39 fields without the label: --no-label)
label 0/1; I1..I13 integers or empty -> dense log(1 + max(x, 0)), empty = 0;
C1..C26 hex categories (1-16 digits) or empty -> 26 tables. Plain or gzip input.

Examples:
  bagpipe preprocess criteo --input train.txt --out data/criteo
  bagpipe preprocess criteo --input test.txt --no-label --vocab-from data/criteo --out data/criteo-test
  bagpipe preprocess criteo --input day_0.gz day_1.gz --eval-files day_23.gz \\
      --max-rows-per-table 10000000 --out data/terabyte
""",
    "avazu": """\
Avazu CSV: id,click,hour,C1,banner_pos,site_id,...,device_conn_type,C14,...,C21.
click is the label (absent with --no-label); hour (YYMMDDHH) becomes the features
hour_of_day (24 rows) and day_of_week (7 rows, Monday = 0); id is ignored; the other 21
columns are categorical (values taken as strings). No dense features. A header line is
recognised (columns may come in any order); without one, the standard order is used.

Examples:
  bagpipe preprocess avazu --input train_head9k.csv --eval-files test_1k.csv --out data/avazu
  bagpipe preprocess avazu --input test_1k.csv --no-header --split 0 --vocab-from data/avazu --out data/avazu-test
""",
    "taobao": """\
Taobao display-ad CSV (header in file): clk,time_stamp,userid,adgroup_id,pid,cate_id,
campaign_id,customer,brand,price,cms_segid,cms_group_id,final_gender_code,age_level,
pvalue_level,shopping_level,occupation,new_user_class_level,click_sequence.
clk is the label; price the dense feature log(1 + max(price, 0)); time_stamp is ignored;
the 15 id columns are categorical; click_sequence (items joined by ^) is a multi-hot
feature with its own table, stored as values + offsets.

Examples:
  bagpipe preprocess taobao --input train.csv --eval-files valid.csv --out data/taobao
  bagpipe preprocess taobao --input test.csv --split 0 --vocab-from data/taobao --out data/taobao-test
""",
}


def _common(p: argparse.ArgumentParser, fmt: str) -> None:
    from bagpipe.config.argtypes import count, path, real

    _positive_int, _fraction = count(1), real(0, 1)
    g = p.add_argument_group("input and output")
    g.add_argument(
        "--input",
        nargs="+",
        action="extend",  # --input A --input B reads both (a repeated option used to drop A)
        type=path,
        default=[],
        metavar="FILE",
        help="raw files (plain or gzip), read in order; - (standard input) or a pipe is read once",
    )
    g.add_argument(
        "--eval-files",
        nargs="+",
        action="extend",
        type=path,
        default=[],
        metavar="FILE",
        help="files that go whole to split 'eval'",
    )
    g.add_argument("--out", required=True, type=path, metavar="DIR", help="output dataset directory")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset already in --out (only if every file there is the dataset's; never an input)",
    )
    g.add_argument(
        "--no-label",
        action="store_true",
        help="input has no label column; every line goes to split 'test' with label 0",
    )
    if fmt != "criteo":
        g.add_argument(
            "--no-header", action="store_true", help="the first line is data (standard column order), never a header"
        )
    g.add_argument(
        "--split",
        type=_fraction,
        metavar="F",
        help="fraction of --input lines (by line order) that go to 'train', the rest to 'eval' "
        "(default 0.9; 1.0 when --eval-files is given)",
    )
    g = p.add_argument_group("categorical features (default: vocabulary, --min-count 1)")
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--max-rows-per-table",
        type=_positive_int,
        metavar="M",
        help="hashing: id = value %% M, a missing value -> 0 (DLRM's --max-ind-range); one pass",
    )
    m.add_argument(
        "--min-count",
        type=_positive_int,
        metavar="K",
        help="vocabulary of the train lines: values seen >= K times get their own row, the rest share row 0 (default 1)",
    )
    m.add_argument(
        "--vocab-from",
        type=path,
        metavar="DIR",
        help="reuse the vocabulary / hashing of dataset DIR (same ids, same table sizes)",
    )
    g = p.add_argument_group("errors and performance")
    g.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="a bad line stops the run naming file and line (fail, default) or is skipped and counted (skip)",
    )
    g.add_argument("--rows-per-shard", type=_positive_int, metavar="N", help="samples per shard file (default 262144)")
    g.add_argument("--workers", type=count(1, 256), metavar="N", help="parser threads (default: CPU count, at most 4)")
    g.add_argument(
        "--block-mb", type=count(1, 4096), default=8, metavar="MB", help="bytes read per block (default 8 MB)"
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.preprocess.registry import FORMATS

    sub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    for name, (_, _, summary) in FORMATS.items():
        sp = sub.add_parser(
            name,
            help=summary,
            description=_FORMAT_HELP[name]
            + "\nSee `bagpipe preprocess --help` and docs/preprocessing.md for splits, vocabularies and errors.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(sp, name)


def run(args: argparse.Namespace) -> int:
    from bagpipe.data.shards import DEFAULT_ROWS_PER_SHARD
    from bagpipe.preprocess.options import Options
    from bagpipe.preprocess.registry import raw_format
    from bagpipe.preprocess.run import run_preprocess

    fmt = raw_format(
        args.format, labelled=not args.no_label, header="no" if getattr(args, "no_header", False) else "auto"
    )
    opts = Options(
        out=args.out,
        inputs=list(args.input),
        eval_files=list(args.eval_files),
        split=args.split,
        labelled=not args.no_label,
        max_rows_per_table=args.max_rows_per_table,
        min_count=args.min_count,
        vocab_from=args.vocab_from,
        on_error=args.on_error,
        overwrite=args.overwrite,
        rows_per_shard=args.rows_per_shard or DEFAULT_ROWS_PER_SHARD,
        workers=args.workers,
        block_bytes=args.block_mb << 20,
        progress=args.progress,
    )
    result = run_preprocess(fmt, opts)
    print(result.summary(f"preprocess {args.format}"))
    if result.skipped:
        for ex in result.bad_examples[:3]:
            print(f"  skipped e.g. {ex}")
    return 0
