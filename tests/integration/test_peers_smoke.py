"""``bagpipe bench peers``: TorchRec's DLRM beside bagpipe full and lookahead.

* Without TorchRec the scenario fails with one line telling the user to run
  ``make peers`` (always runs: TorchRec's absence is simulated).
* With TorchRec (``make peers``), ``bench peers --quick`` writes results.json,
  results.md and peers.png, and all configurations agree on the eval log loss:
  TorchRec starts from bagpipe's initial values and computes the same model, so only
  float rounding separates it from bagpipe ``full``; ``lookahead`` (memory and disk
  stores) equals ``full`` exactly. Skips (reason printed by ``-ra``) when TorchRec is not installed.
"""

from __future__ import annotations

import json
import sys

import pytest

pytestmark = pytest.mark.integration


def test_peers_without_torchrec_says_make_peers(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec", None)  # `import torchrec` now raises ImportError
    rc, out, err = run_cli("bench", "peers", "--quick", "--out", tmp_path / "peers")
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "make peers" in lines[0]
    assert not (tmp_path / "peers" / "results.json").exists()


def test_peers_quick_writes_results(run_cli, tmp_path):
    pytest.importorskip(
        "torchrec", reason="TorchRec is not installed: `make peers` installs fbgemm-gpu-cpu + torchrec 1.8.0"
    )
    out = tmp_path / "peers"
    rc, stdout, err = run_cli("bench", "peers", "--quick", "--out", out)
    assert rc == 0, err
    for name in ("results.json", "results.md", "peers.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    payload = json.loads((out / "results.json").read_text())
    res = payload["results"]
    assert set(res) == {"full", "lookahead", "lookahead-disk", "torchrec"}
    for r in res.values():
        assert r["samples_per_s"] > 0 and r["peak_anon_rss_mb"] > 0
    assert res["torchrec"]["ratio_to_torchrec"] == pytest.approx(1.0)
    for key in ("lookahead", "lookahead-disk"):
        assert res[key]["rows_in_trainer_fraction"] <= 0.10 + 1e-9
        assert res[key]["eval_logloss"] == res["full"]["eval_logloss"]
    assert res["torchrec"]["plan"] and all(p["kernel"] == "fused" for p in res["torchrec"]["plan"].values())
    # same maths from the same initial values: the losses agree to float rounding
    assert abs(res["torchrec"]["eval_logloss"] - res["full"]["eval_logloss"]) < 1e-3
    md = (out / "results.md").read_text()
    assert "TorchRec FUSED" in md and "bagpipe lookahead" in md
    assert "TorchRec FUSED" in stdout
