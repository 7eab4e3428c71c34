"""Every JSON file bagpipe writes is JSON other tools read: a non-finite number is ``null``.

Python's json wrote an undefined figure (the AUC of an eval split of one class, a ratio
to a configuration that did not run) as the bare word ``NaN`` or ``Infinity``, which
``jq``, JavaScript and most JSON readers refuse. :func:`bagpipe.jsonout.json_text` writes
it as ``null`` with ``allow_nan=False``, so one that slips past is an error, not an
invalid file; every ``json.dump(s)`` in the package passes ``allow_nan=False`` (the
check below). The run's files (metrics.jsonl, summary.json, --summary-json, config.json)
come out valid, and bagpipe's readers of them -- ``--resume`` (metrics.jsonl), ``plot``,
a benchmark's medians and tables, the run's one line -- take ``null`` where a number was.
"""

from __future__ import annotations

import ast
import decimal
import json
import math
from pathlib import Path

import numpy as np
import pytest
from repo import PACKAGE

from bagpipe.bench.harness.report import fixed, markdown_table, median_spread, write_results
from bagpipe.commands.train import summary_line
from bagpipe.jsonout import finite, json_text
from bagpipe.train.evaluate import eval_line, no_eval
from bagpipe.train.plot import plot_runs, read_metrics
from bagpipe.train.rundir import RunDir, kept_records

pytestmark = pytest.mark.unit

NAN, INF = float("nan"), float("inf")

#: Writers that hold no measured float: export's files (sizes, sums and names only).
LEFT = {"export/tensorfile.py", "export/write.py"}


def strict_json(text: str):
    """``text`` parsed as other tools parse JSON: a bare NaN or Infinity is an error."""

    def bare(word: str):
        raise AssertionError(f"{word} is not JSON: {text[:200]}")

    return json.loads(text, parse_constant=bare)


def test_non_finite_floats_are_null_wherever_they_sit():
    doc = {"a": NAN, "b": [1.5, INF, -INF, (NAN, 2)], "c": {"d": np.float64("nan"), "e": "NaN", "f": None, "g": 3}}
    assert finite(doc) == {
        "a": None,
        "b": [1.5, None, None, [None, 2]],
        "c": {"d": None, "e": "NaN", "f": None, "g": 3},
    }
    text = json_text(doc, indent=2)
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    assert strict_json(text)["b"] == [1.5, None, None, [None, 2]]
    assert json_text(0.1) == json.dumps(0.1)  # a finite number as json writes it


def test_a_non_finite_value_that_slips_past_is_an_error_not_an_invalid_file():
    with pytest.raises(ValueError, match="JSON compliant"):
        json_text({"x": decimal.Decimal("NaN")}, default=float)  # a type finite() does not walk


def json_writes_without_allow_nan(package: Path) -> list[str]:
    """Every ``json.dump``/``json.dumps`` call under ``package`` without ``allow_nan=False``."""
    found = []
    for p in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            f = node.func
            if not (isinstance(f.value, ast.Name) and f.value.id == "json" and f.attr in ("dump", "dumps")):
                continue
            strict = any(
                k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords
            )
            if not strict:
                found.append(f"{p.relative_to(package).as_posix()}:{node.lineno}")
    return found


def test_the_finder_finds_a_lax_json_write(tmp_path):
    (tmp_path / "m.py").write_text(
        "import json\nA = json.dumps({})\nB = json.dumps({}, allow_nan=False)\njson.dump({}, open('x', 'w'))\n"
    )
    assert json_writes_without_allow_nan(tmp_path) == ["m.py:2", "m.py:4"]


def test_every_json_write_of_the_package_refuses_nan():
    lax = [w for w in json_writes_without_allow_nan(PACKAGE) if w.split(":")[0] not in LEFT]
    assert not lax, (
        "json.dump(s) without allow_nan=False (write through bagpipe.jsonout.json_text, which makes a "
        f"non-finite float null): {lax}"
    )


def test_the_runs_files_hold_null_for_a_non_finite_figure(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    log = run.metrics()
    log.write(step=10, loss=0.5, samples_per_s=INF)
    log.write(step=10, eval_logloss=0.6, eval_auc=NAN, eval_samples=64)
    log.close()
    lines = [strict_json(line) for line in run.metrics_file.read_text().splitlines()]
    assert lines[0]["samples_per_s"] is None and lines[1]["eval_auc"] is None
    summary = {"mode": "full", "steps": 10, "samples_per_s": 900.0, "train_logloss": 0.5, "eval_auc": NAN}
    run.write_summary(summary, also=str(tmp_path / "copy.json"))
    for f in (run.summary_file, tmp_path / "copy.json"):
        assert strict_json(f.read_text())["eval_auc"] is None
    assert summary["eval_auc"] != summary["eval_auc"]  # the caller's dict is left as it was
    # --resume keeps the records up to its step, null figures and all
    assert len(kept_records(run.metrics_file, run.metrics_file.read_bytes(), 10)) == 2


def test_readers_take_null_where_a_number_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [
        {"step": 1, "loss": 0.69},
        {"step": 5, "loss": 0.6},
        {"step": 5, "eval_logloss": 0.61, "eval_auc": None, "eval_samples": 64},  # an eval split of one class
        {"step": 10, "eval_logloss": 0.58, "eval_auc": 0.7, "eval_samples": 64},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    train, evals = read_metrics(run)
    assert len(train) == 2 and [e["step"] for e in evals] == [5, 10]  # the logloss of step 5 is still drawn
    assert plot_runs([run], tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    med, spread = median_spread([None])
    assert math.isnan(med) and math.isnan(spread)
    assert markdown_table(["auc"], [[None], [NAN], [0.7]]).splitlines()[2:] == ["| n/a |", "| n/a |", "| 0.7 |"]
    line = summary_line(
        {
            "mode": "full",
            "steps": 10,
            "samples_per_s": None,
            "train_logloss": None,
            "eval_logloss": 0.5,
            "eval_auc": None,
            "peak_rss_mb": 100.0,
            "params_sha256": None,
        }
    )
    assert "n/a samples/s, train logloss n/a, eval logloss 0.5000, eval AUC n/a" in line


def test_a_benchmarks_results_are_valid_json(tmp_path):
    write_results(tmp_path, "x", {"scenario": "x", "ratio_to_lookahead": NAN, "runs": [1.0, INF]}, "| t |")
    assert strict_json((tmp_path / "results.json").read_text()) == {
        "scenario": "x",
        "ratio_to_lookahead": None,
        "runs": [1.0, None],
    }


def test_a_bench_line_prints_a_null_or_nan_figure_as_na():
    assert [fixed(None), fixed(NAN), fixed(0.71234), fixed(0.5, 2)] == ["n/a", "n/a", "0.7123", "0.50"]


def test_a_printed_line_says_na_for_a_nan_figure_before_it_is_written():
    """A one-class eval split's AUC, NE and calibration are NaN in memory (null once written):
    the run's line and the evaluation's line say n/a, as docs/runs.md promises, and an
    evaluation of samples whose AUC is null is not mistaken for no eval split."""
    line = summary_line(
        {
            "mode": "full",
            "steps": 10,
            "samples_per_s": 1000.0,
            "train_logloss": 0.5,
            "eval_logloss": 0.36,
            "eval_auc": NAN,
            "eval_ne": NAN,
            "eval_calibration": NAN,
            "peak_rss_mb": 100.0,
            "params_sha256": None,
        }
    )
    assert "eval logloss 0.3600, eval AUC n/a, NE n/a, calibration n/a," in line and "nan" not in line
    one_class = {"eval_logloss": 0.36, "eval_auc": NAN, "eval_ne": None, "eval_calibration": NAN}
    one_class |= {"eval_accuracy": 1.0, "eval_samples": 1}
    assert eval_line(one_class) == (
        "eval logloss 0.3600, eval AUC n/a, NE n/a, calibration n/a, accuracy 1.0000 on 1 samples"
    )
    assert eval_line(no_eval()) == "no eval split"
