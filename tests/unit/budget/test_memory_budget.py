"""Memory budgets: where the budget comes from, how a run is sized to it, and the refusals.

Unit (no training):

* the memory cgroup's limit is read as a user's container would set it: cgroup v1
  (``hierarchical_memory_limit``, else ``memory.limit_in_bytes``; the "no limit" sentinel
  is none) and v2 (the smallest ``memory.max`` of the group and its ancestors), found
  through ``/proc/self/cgroup``, on fake cgroup trees; none without a memory controller;
* the budget's fit keeps what the user set and gives way on defaults (plans read ahead,
  a default hot tier, the default cache), and refuses in one line naming the smallest
  budget that works; a bigger cache or a longer window never estimates smaller;
* the disk store's write-behind starts writeback every half of its dirty bound (counted
  on a real file); its residency sample (``mincore``) calls a round of never-read pages
  of a sparse file cold and the same pages warm once read, so only a cold round is hinted; ``pages_spanned`` counts distinct pages, and a store's reads and
  writes agree with a dict across rounds smaller than a batch and with rows out of order;
* ``params_sha256`` does not depend on how the rows are chunked (a store's chunks follow
  its budget);
* a local job's roles together (the launcher included) are held to an explicit
  ``--memory-budget-mb`` as to a cgroup's limit: a refusal naming every role's share and
  the smallest budget that works, accepted when they fit, the smaller of the cgroup's limit
  and the option governs; the trainers' fitted estimate keeps the budget it was fitted to.

Integration (tiny data, in-process): a budget too small is a one-line refusal naming the
minimum, before the run folder is made; ``bagpipe plan`` prints the estimate part by part
and exits 2 with the same line when the run does not fit; a run's summary records the
budget, the estimate and its memory by step; `plan` and `train` refuse a local job over its
``--memory-budget-mb`` in the same words, `train` before any role starts, and `plan`'s
"fits: yes" stands beside a job total within the budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bagpipe.budget.cgroup import Group, own_group
from bagpipe.budget.estimate import MIB, RunShape, Sizes, estimate
from bagpipe.budget.sizing import MARGIN, Budget, BudgetError, Wanted, fit, smallest_io
from bagpipe.config.modes import mode_spec
from bagpipe.store.diskio import PAGE, DiskIO, Residency, WriteBehind, pages_spanned

# --------------------------------------------------------------------------- cgroups


@pytest.mark.unit
def test_cgroup_v1_limit_from_proc_self_cgroup(tmp_path):
    g = tmp_path / "memory" / "jobs" / "a"
    g.mkdir(parents=True)
    (g / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (g / "memory.stat").write_text("cache 5\nhierarchical_memory_limit 536870912\ntotal_rss 7\n")
    found = own_group("9:pids:/\n4:memory:/jobs/a\n0::/\n", root=tmp_path)
    assert found == Group(1, g)
    assert found.limit_bytes() == 512 * MIB  # an ancestor's limit applies
    (g / "memory.stat").write_text("cache 5\nhierarchical_memory_limit 9223372036854771712\n")
    assert found.limit_bytes() is None  # the sentinel: no limit
    (g / "memory.stat").write_text("cache 5\n")
    (g / "memory.limit_in_bytes").write_text("1073741824\n")
    assert found.limit_bytes() == 1 << 30


@pytest.mark.unit
def test_cgroup_v2_limit_is_the_smallest_on_the_path(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory io\n")
    leaf = tmp_path / "pod" / "job"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")
    (tmp_path / "pod" / "memory.max").write_text(f"{768 * MIB}\n")
    found = own_group("0::/pod/job\n", root=tmp_path)
    assert found == Group(2, leaf) and found.limit_bytes() == 768 * MIB
    (tmp_path / "pod" / "memory.max").write_text("max\n")
    assert found.limit_bytes() is None


@pytest.mark.unit
def test_no_memory_controller_is_no_group(tmp_path):
    assert own_group("1:cpu:/\n0::/x\n", root=tmp_path) is None


@pytest.mark.unit
def test_budget_sources(monkeypatch):
    import bagpipe.budget.sizing as budget

    monkeypatch.setattr(budget, "own_limit", lambda: (600 * MIB, "cgroup v1 /x"))
    b = Budget.of(None)
    assert b.bytes == 600 * MIB and b.enforced and "cgroup" in b.source
    assert b.usable == int(600 * MIB * (1 - MARGIN))
    assert Budget.of(0).bytes is None
    assert Budget.of(1000).enforced is True and Budget.of(500).enforced is False  # the group's limit is lower / higher
    monkeypatch.setattr(budget, "own_limit", lambda: (None, "no memory cgroup"))
    assert Budget.of(None).bytes is None and Budget.of(512).enforced is False


# --------------------------------------------------------------------------- the fit


def shape(mode="lookahead", **kw) -> RunShape:
    base: dict[str, Any] = dict(
        spec=mode_spec(mode), store="disk", num_rows=8_000_000, dim=64, state_dim=1, batch_size=2048,
        num_features=26, lookups=2048 * 26, unique=12_000, batch_bytes=1_000_000, dense_params=500_000,
        dense_states=1, saved_bytes=30 * MIB, sample_bytes=264, eval_batch=2048, fetch_rows=2000, evict_rows=2000,
    )  # fmt: skip
    return RunShape(**(base | kw))


def wanted(cache_rows=400_000, staged=21, hot_rows=0, cache_fixed=False, hot_fixed=False) -> Wanted:
    sizes = Sizes(cache_rows=cache_rows, hot_rows=hot_rows, lookahead=20, staged=staged, io=DiskIO())
    return Wanted(sizes, cache_fixed=cache_fixed, hot_fixed=hot_fixed, minimum_cache=2048 * 26)


@pytest.mark.unit
def test_without_a_budget_nothing_changes():
    f = fit(Budget(None, "none"), shape(), wanted())
    assert f.sizes.cache_rows == 400_000 and f.sizes.staged == 21 and f.changes == () and f.fits


@pytest.mark.unit
def test_a_tight_budget_lowers_the_defaults_and_keeps_what_was_set():
    big = fit(Budget(None, "none"), shape(), wanted()).estimate.total
    low = estimate(shape(), Sizes(2048 * 26, 0, 20, 1, smallest_io(DiskIO()))).total

    def budget(usable: float) -> Budget:
        return Budget(int(usable / (1 - MARGIN)) + 1, "test")

    at_big = fit(budget(big), shape(), wanted())  # (the I/O bounds scale with the budget)
    two = estimate(shape(), dataclasses.replace(at_big.sizes, staged=2)).total
    b = budget((at_big.estimate.total + two) / 2)  # short by what 10 fewer plans read ahead hold
    f = fit(b, shape(), wanted())
    assert f.fits and b.usable is not None and f.estimate.total <= b.usable
    assert f.sizes.staged < 21 and f.sizes.cache_rows == 400_000 and f.changes[0].startswith(f"{f.sizes.staged} plans")
    tight = budget(low + 10 * MIB)  # the default cache must give way
    g = fit(tight, shape(), wanted())
    assert tight.usable is not None
    assert 2048 * 26 <= g.sizes.cache_rows < 400_000 and g.estimate.total <= tight.usable
    assert any(c.startswith("a cache of") for c in g.changes)
    with pytest.raises(BudgetError, match=r"lower --cache-rows / --cache-budget-mb to at most [\d,]+ rows"):
        fit(tight, shape(), wanted(cache_fixed=True))  # the user's cache stays: named, with the most that fits


@pytest.mark.unit
def test_the_most_cache_named_is_one_answer_that_fits_whatever_was_asked():
    """Newcomer round 21: for one budget "at most" said 0, 115,425 or 835,425 rows as the
    cache asked for grew (the other parts were sized at the size asked for)."""
    import re

    low = estimate(shape(), Sizes(2048 * 26, 0, 20, 1, smallest_io(DiskIO()))).total
    b = Budget(int((low + 40 * MIB) / (1 - MARGIN)), "test")
    named = set()
    for asked in (1_000_000, 3_000_000, 6_000_000):
        with pytest.raises(BudgetError) as e:
            fit(b, shape(), wanted(cache_rows=asked, cache_fixed=True))
        found = re.search(r"to at most ([\d,]+) rows", str(e.value))
        assert found is not None, str(e.value)
        named.add(int(found.group(1).replace(",", "")))
    assert len(named) == 1, named
    most = named.pop()
    assert most > 2048 * 26
    assert fit(b, shape(), wanted(cache_rows=most, cache_fixed=True)).fits  # it fits, one more does not
    with pytest.raises(BudgetError):
        fit(b, shape(), wanted(cache_rows=most + 1, cache_fixed=True))


@pytest.mark.unit
def test_a_default_hot_tier_gives_way_before_the_cache():
    w = wanted(hot_rows=1_000_000)
    big = fit(Budget(None, "none"), shape("fae"), w).estimate.total
    f = fit(Budget(int(big * 0.8), "test"), shape("fae"), w)
    assert 0 < f.sizes.hot_rows < 1_000_000 and any("hot tier" in c for c in f.changes)


@pytest.mark.unit
def test_too_small_a_budget_names_the_smallest_that_works():
    with pytest.raises(BudgetError) as e:
        fit(Budget(200 * MIB, "--memory-budget-mb 200"), shape(), wanted())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("memory budget 200 MiB (--memory-budget-mb 200) is too small")
    need = int(msg.split("the smallest budget that works is ")[1].split(" MiB")[0].replace(",", ""))
    assert e.value.estimate is not None and need * MIB * (1 - MARGIN) >= e.value.estimate.total
    fit(Budget((need + 1) * MIB, "test"), shape(), wanted())  # and that budget works


@pytest.mark.unit
def test_the_estimate_grows_with_what_it_holds():
    s, w = shape(), wanted().sizes
    changes: list[dict[str, Any]] = [
        dict(cache_rows=800_000),
        dict(staged=40),
        dict(lookahead=40),
        dict(hot_rows=10_000),
    ]
    for change in changes:
        assert estimate(s, dataclasses.replace(w, **change)).total > estimate(s, w).total, change
    assert estimate(dataclasses.replace(s, num_rows=16_000_000), w).total > estimate(s, w).total
    full = estimate(shape("full", store="memory"), w)
    assert full.part("store") >= 8_000_000 * 65 * 4  # the full tables are in the process


@pytest.mark.unit
def test_a_distributed_trainer_counts_the_plans_its_receiver_holds_ahead():
    """A distributed trainer's plan receiver holds up to --plans-in-flight plans from the
    oracle before its step takes them (bagpipe.distributed.oracle_role.PlanReceiver)."""
    s, w = shape(), wanted().sizes
    base = estimate(s, w, "remote-trainer")
    four = estimate(dataclasses.replace(s, plans_received=4), w, "remote-trainer")
    eight = estimate(dataclasses.replace(s, plans_received=8), w, "remote-trainer")
    assert base.part("plans received") == 0
    assert 0 < four.part("plans received") and eight.part("plans received") == 2 * four.part("plans received")
    assert eight.total - four.total == four.part("plans received")
    assert estimate(dataclasses.replace(s, plans_received=4), w).part("plans received") == 0  # one process: none
    # a plan also lists the slots of the global batch's synchronised rows: more trainers, larger plans
    wide = estimate(dataclasses.replace(s, plans_received=4, trainers=8), w, "remote-trainer")
    assert wide.part("plans received") > four.part("plans received")


# --------------------------------------------------------------------------- the disk store's I/O


@pytest.mark.unit
def test_pages_spanned_counts_distinct_pages():
    rng = np.random.default_rng(0)
    for row_bytes in (68, 260, 4096, 5000):
        rows = np.unique(rng.integers(0, 50_000, 3000))
        brute = {p for r in rows for p in range(r * row_bytes // PAGE, (r * row_bytes + row_bytes - 1) // PAGE + 1)}
        assert pages_spanned(rows, row_bytes) == len(brute), row_bytes


@pytest.mark.unit
def test_write_behind_starts_writeback_every_half_bound(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"x" * (1 << 20), 0)
        wb = WriteBehind(fd, 64 * PAGE)
        for _ in range(10):
            wb.wrote(8 * PAGE)
        assert wb.rounds == 2 and wb.pending == 16 * PAGE  # after 32 and 64 pages; 16 pending
    finally:
        os.close(fd)


@pytest.mark.unit
def test_residency_tells_cold_pages_from_cached_ones(tmp_path):
    import mmap

    pages = np.arange(0, 1024, 32)
    with open(tmp_path / "f", "w+b") as f:
        f.truncate(1024 * PAGE)  # sparse: no page of it has been read, none is cached
        m = mmap.mmap(f.fileno(), 1024 * PAGE)
        m.madvise(mmap.MADV_RANDOM)  # as the store maps it: a fault reads its page only
        try:
            r = Residency(m)
            if r.base is None:
                pytest.skip("no mincore in this C library")
            assert r.cold(pages)
            for p in pages.tolist():
                m[p * PAGE]  # read: the page enters the page cache
            assert not r.cold(pages)
            assert r.cold(pages + 16)  # the pages between stay cold
        finally:
            del r
            m.close()


@pytest.mark.unit
def test_disk_store_rounds_and_write_behind_keep_values(tmp_path):
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    init = RowInitializer([5000, 15000], 16, seed=3)
    rng = np.random.default_rng(1)
    io = DiskIO(threads=2, hint_bytes=37 * PAGE, dirty_bytes=8 * PAGE, chunk_rows=999)
    truth_w: dict[int, np.ndarray] = {}
    truth_s: dict[int, np.ndarray] = {}
    with DiskStore(init, 2, tmp_path / "s", io=io) as store:
        for _ in range(5):
            rows = rng.choice(20_000, 700, replace=False)  # unsorted: the store sorts and puts them back
            w = rng.standard_normal((700, 16)).astype(np.float32)
            s = rng.standard_normal((700, 2)).astype(np.float32)
            store.write(rows, w, s)
            truth_w.update(zip(rows.tolist(), w))
            truth_s.update(zip(rows.tolist(), s))
        assert store._behind is not None and store._behind.rounds > 0
        ask = rng.permutation(20_000)[:3000]
        got_w, got_s = store.read(ask)
        for i, r in enumerate(ask.tolist()):
            want_w = truth_w.get(r, init.rows(np.array([r]))[0])
            assert np.array_equal(got_w[i], want_w) and np.array_equal(got_s[i], truth_s.get(r, np.zeros(2)))
        chunks = list(store.chunks())
        assert [len(w) for _, w, _ in chunks[:2]] == [999, 999]  # the store's chunk rows
        w_all = np.concatenate([w for _, w, _ in chunks])
        assert np.array_equal(w_all[ask], got_w)


@pytest.mark.unit
def test_digest_does_not_depend_on_chunks():
    """The digest hashes row by row, so a store may chunk its rows as its budget allows."""
    from bagpipe.store.init import RowInitializer
    from bagpipe.train.rundir import hash_rows

    rng = np.random.default_rng(2)
    init = RowInitializer([600, 400], 8, seed=3)
    ids = np.arange(1000, dtype=np.int64)
    w = rng.standard_normal((1000, 8)).astype(np.float32)
    s = rng.standard_normal((1000, 1)).astype(np.float32)
    digests = set()
    for cuts in ([1000], [1, 999], [333, 333, 334], [17] * 58 + [14]):
        h, a = hashlib.sha256(), 0
        parts = []
        for n in cuts:
            parts.append((ids[a : a + n], w[a : a + n], s[a : a + n]))
            a += n
        hash_rows(h, init, iter(parts))
        digests.add(h.hexdigest())
    assert len(digests) == 1
    record = np.concatenate([ids.view(np.uint8).reshape(-1, 8), w.view(np.uint8), s.view(np.uint8)], axis=1)
    row_by_row = hashlib.sha256(record.tobytes()).hexdigest()
    assert digests == {row_by_row}


# --------------------------------------------------------------------------- a local job's budget


def local_job() -> tuple:
    """The roles of a 2 + 1 local job: each trainer 225 MiB, the server 160, the oracle
    157; with the launcher's 245: 1,012 MiB."""
    from bagpipe.budget.estimate import Estimate, Part
    from bagpipe.budget.job import RoleShare

    def est(role: str, mib: int) -> Estimate:
        return Estimate(role, (Part("interpreter and torch", 100 * MIB), Part("rest", (mib - 100) * MIB)))

    return (
        RoleShare("each trainer", 2, est("remote-trainer", 225)),
        RoleShare("the embedding server", 1, est("server", 160)),
        RoleShare("the oracle", 1, est("oracle", 157)),
    )


def cgroup_limit(monkeypatch, mib: int | None) -> None:
    import bagpipe.budget.sizing as sizing

    monkeypatch.setattr(sizing, "own_limit", lambda: (None if mib is None else mib * MIB, "cgroup v1 /x"))


@pytest.mark.unit
def test_a_local_jobs_memory_budget_mb_holds_every_role_together(monkeypatch):
    from bagpipe.budget.job import check_job, shared_budget

    cgroup_limit(monkeypatch, None)  # no cgroup: before, nothing held the roles together
    with pytest.raises(BudgetError) as e:
        check_job(local_job(), shared_budget(900))  # as the launcher and `plan` call it
    # 245 + 2 x 225 + 160 + 157 = 1,012 MiB; 1,012 / 0.85 = 1,190.6: 1,191 MiB
    assert str(e.value) == (
        "memory budget 900 MiB (--memory-budget-mb 900) is shared by every role of this local job and does not "
        "hold them: launcher 245 + each trainer 225 x 2 + the embedding server 160 + the oracle 157 = 1,012 MiB, "
        "so the smallest budget that works is 1,191 MiB (15% kept free, each role sized to it); raise --memory-budget-mb, "
        "use fewer trainers or servers, or start the roles on machines of their own (torchrun and `bagpipe worker`, "
        "docs/distributed.md)"
    )
    check_job(local_job(), shared_budget(1191))  # the budget named holds them
    with pytest.raises(BudgetError, match="memory budget 1,190 MiB"):
        check_job(local_job(), shared_budget(1190))


@pytest.mark.unit
def test_the_smaller_of_the_cgroup_and_memory_budget_mb_governs_a_local_job(monkeypatch):
    from bagpipe.budget.job import check_job, shared_budget

    cgroup_limit(monkeypatch, 1100)  # a cgroup below M: the cgroup's limit is named
    assert shared_budget(2000) == shared_budget() == Budget.of(None)
    named = (
        r"^memory budget 1,100 MiB \(the memory cgroup's limit \(cgroup v1 /x\)\) is shared by every role .* = "
        r"1,012 MiB, .* is 1,191 MiB .*; raise the memory cgroup's limit,"
    )
    with pytest.raises(BudgetError, match=named):
        check_job(local_job(), shared_budget(2000))
    cgroup_limit(monkeypatch, 2000)  # M below the cgroup: M is named
    assert shared_budget(1100).source == "--memory-budget-mb 1100"
    with pytest.raises(BudgetError, match=r"^memory budget 1,100 MiB \(--memory-budget-mb 1100\) is shared"):
        check_job(local_job(), shared_budget(1100))
    check_job(local_job(), shared_budget(1200))  # both hold the job: accepted
    cgroup_limit(monkeypatch, 1200)
    assert shared_budget(1200) == Budget.of(None)  # equal: the cgroup's
    # --memory-budget-mb 0: no budget; the cgroup's limit alone, and a warning rather than a refusal
    assert shared_budget(0) == Budget.of(None)
    check_job(local_job(), Budget(1000 * MIB, "the memory cgroup's limit (x)"), off=True)


# --------------------------------------------------------------------------- runs


@pytest.mark.integration
def test_a_budget_too_small_is_refused_before_the_run_starts(tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", "5", "--batch-size", "64",
                         "--mode", "lookahead", "--store", "disk", "--memory-budget-mb", "100", "--no-progress")  # fmt: skip
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "memory budget 100 MiB (--memory-budget-mb 100) is too small for this run" in err
    need = int(err.split("the smallest budget that works is ")[1].split(" MiB")[0].replace(",", ""))
    assert 200 < need < 400
    assert not out.exists()  # nothing of the run was made
    rc, out_, _ = run_cli("plan", "--data", tiny_data, "--batch-size", "64", "--mode", "lookahead", "--store", "disk",
                          "--memory-budget-mb", "100")  # fmt: skip
    assert rc == 2
    assert "interpreter and torch" in out_ and "oracle" in out_ and "does not fit: memory budget 100 MiB" in out_
    rc, out_, _ = run_cli("plan", "--data", tiny_data, "--batch-size", "64", "--mode", "lookahead", "--store", "disk",
                          "--memory-budget-mb", str(need + 1))  # fmt: skip
    assert rc == 0 and "fits: yes" in out_, out_


@pytest.mark.integration
def test_a_run_reports_its_budget_estimate_and_memory_by_step(tiny_data, tmp_path):
    # its own process: the measured peak is the run's, not this test process's heap
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "bagpipe", "train", "--data", tiny_data, "--out", str(out),
                           "--steps", "30", "--batch-size", "64", "--mode", "lookahead", "--store", "disk",
                           "--memory-budget-mb", "900", "--no-progress", "--no-final-checkpoint"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads((out / "summary.json").read_text())["memory"]
    assert m["budget_mb"] == 900 and m["budget_source"] == "--memory-budget-mb 900"
    assert m["estimate_mb"] == pytest.approx(sum(m["estimate_parts_mb"].values()), abs=0.5)
    assert m["sizes"]["dirty_mb"] == pytest.approx(900 * (1 - MARGIN) / 32)
    # no memory cgroup of 900 MiB or less enforces it here: the store bounds its own page cache
    assert (m["sizes"]["page_cache_mb"] is None) == Budget.of(900).enforced
    assert [p[0] for p in m["by_step"]] == [1, 10, 20, 30] and all(p[1] > 100 for p in m["by_step"])
    anon = m["estimate_mb"] - m["estimate_parts_mb"]["store page cache"]
    assert abs(anon - m["peak_anon_mb"]) <= 0.25 * m["peak_anon_mb"], (anon, m["peak_anon_mb"])


def child_pids() -> set[int]:
    """This process's children (every thread's)."""
    return {int(pid) for f in Path("/proc/self/task").glob("*/children") for pid in f.read_text().split()}


@pytest.mark.integration
def test_plan_and_train_refuse_a_local_job_over_memory_budget_mb_alike(tiny_data, tmp_path, run_cli):
    from bagpipe.budget.cgroup import own_limit

    limit, where = own_limit()
    if limit is not None and limit < 4 << 30:
        pytest.skip(f"this process's memory cgroup ({where}) would be the smaller budget")
    job = ("--data", tiny_data, "--steps", "5", "--no-progress", "--batch-size", "128", "--mode", "lookahead",
           "--trainers", "2", "--servers", "1", "--memory-budget-mb", "900")  # fmt: skip
    out = tmp_path / "run"
    before = child_pids()
    rc, stdout, err = run_cli("train", *job, "--out", out)
    assert rc == 2, stdout + err
    [said] = [line.split(": error: ", 1)[1] for line in err.splitlines() if line.startswith("bagpipe train: error: ")]
    assert re.fullmatch(
        r"memory budget 900 MiB \(--memory-budget-mb 900\) is shared by every role of this local job and does not "
        r"hold them: launcher 245 \+ each trainer \d+ x 2 \+ the embedding server \d+ \+ the oracle \d+ = "
        r"([\d,]+) MiB, so the smallest budget that works is ([\d,]+) MiB \(15% kept free, each role sized to it\); raise "
        r"--memory-budget-mb, .*",
        said,
    ), said
    assert "[launcher]" not in stdout + err and "[trainer" not in stdout + err  # refused before any role started
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing of the run was made
    assert child_pids() <= before  # no role left behind
    rc, stdout, err = run_cli("plan", *job)
    assert rc == 2 and f"does not fit: {said}\n" in stdout, stdout + err
    assert "fits: yes" not in stdout
    # the budget named holds the job: `fits: yes` beside a total within it
    need = said.split("the smallest budget that works is ")[1].split(" MiB")[0].replace(",", "")
    rc, stdout, err = run_cli("plan", *job[:-1], need)
    assert rc == 0, stdout + err
    total = re.search(r"^the job on one machine .*: ([\d,]+) MiB$", stdout, re.M)
    fits = re.search(r"^fits: yes \(the job's ([\d,]+) of ([\d,]+) MiB of --memory-budget-mb (\d+)\)$", stdout, re.M)
    assert total is not None and fits is not None, stdout
    job_mib, usable, m = (int(x.replace(",", "")) for x in fits.groups())
    assert job_mib == int(total.group(1).replace(",", "")) <= usable and m == int(need)
