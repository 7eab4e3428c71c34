"""The gpu-check's results as Markdown: ``results.md``, and the GPU section of docs/gpu.md.

Every step has its section, whatever happened to it: its table when it wrote a result,
else a line saying it was stopped at its limit or failed before it did. A figure a
device cannot give (a GPU memory peak on the CPU twin) reads ``n/a``.
"""

from __future__ import annotations


def fmt(v, spec: str = ",.0f") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _tests(f: dict) -> list[str]:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(f["counts"].items())) or "none reached"
    out = [f"{f['selected']} selected: {counts}; {f['not_reached']} not reached.", ""]
    rows = [[f"`{t['test']}`", t["outcome"], t["reason"] or ""] for t in f["tests"]]
    return out + table(["test", "outcome", "reason"], rows)


def _peak(r: dict) -> str:
    return f"{fmt(r.get('peak_allocated_mb'), ',.1f')} / {fmt(r.get('peak_reserved_mb'), ',.1f')}"


def _exactness(f: dict) -> list[str]:
    out = [f"Deterministic algorithms on; {f['steps']} steps of batch {f['batch_size']}, DLRM, Adagrad.", ""]
    rows = [[k, f"`{(r['params_sha256'] or 'n/a')[:16]}`", fmt(r["equal_to_full"]), fmt(r["eval_logloss"], ".6f"),
             fmt(r["samples_per_s"]), _peak(r)] for k, r in f["runs"].items()]  # fmt: skip
    out += table(
        ["run", "params_sha256", "equal to full", "eval log loss", "samples/s", "device peak MiB (alloc / reserved)"],
        rows,
    )
    rows = [[k, a["promise"], fmt(a["params_equal"]), fmt(a["eval_logloss_diff"], ".2e"), fmt(a["passed"])]
            for k, a in f["against_cpu"].items()]  # fmt: skip
    return (
        out
        + ["", "Against the same runs on the CPU:", ""]
        + table(["run", "promise", "params equal", "eval log loss diff", "kept"], rows)
    )


def _bench(f: dict) -> list[str]:
    out: list[str] = []
    head = ["mode/store", "samples/s", "vs full", "hit rate", "ms/step: wait / fwd / bwd / opt / write-back",
            "pipeline CPU ms/step", "trainer CPU ms/step", "device peak MiB (alloc / reserved)"]  # fmt: skip
    for run in f["runs"]:
        conf = ", ".join(f"{k} {v}" for k, v in (run.get("config") or {}).items())
        out += [f"`bagpipe bench modes --device {f['bench_device']}`: {conf}; {fmt(run.get('total_rows'))} rows, "
                f"cache {fmt(run.get('cache_rows'))} rows.", ""]  # fmt: skip
        rows = []
        for k, r in run["results"].items():
            t = r["time_per_step_ms"]
            parts = ("wait_embeddings", "forward", "backward", "optimizer", "writeback")
            phases = " / ".join(fmt(t.get(p), ".2f") for p in parts)
            rows.append([k, fmt(r["samples_per_s"]), fmt(r["ratio_to_full"], ".2f") + "x", fmt(r["hit_rate"], ".1%"),
                         phases, fmt(r["pipeline_cpu_ms"], ".2f"), fmt(r["trainer_cpu_ms"], ".2f"), _peak(r)])  # fmt: skip
        out += table(head, rows) + [""]
    return out[:-1]


def _beyond(f: dict) -> list[str]:
    r = f["lookahead"]
    rows = [
        ["rows; tables with Adagrad state", f"{f['rows']:,}; {fmt(f['tables_mb'], ',.1f')} MiB"],
        ["device memory budget", f"{fmt(f['budget_mb'], ',.0f')} MiB"],
        ["`--mode full` under the budget", "refused: " + f["full_refused"] if f["full_refused"] else "NOT refused"],
        ["lookahead/memory, steady samples/s", fmt(r["samples_per_s"])],
        ["device peak MiB (alloc / reserved)", _peak(r)],
        ["peak under the budget", fmt(f["peak_under_budget"])],
    ]
    return [f"{f['steps']} steps of batch {f['batch_size']}.", ""] + table(["", ""], rows)


def _data_parallel(f: dict) -> list[str]:
    rows = [
        ["trainers x servers", f"{f['trainers']} x {f['servers']}"],
        ["trainers' backend", fmt(f["trainer_backend"])],
        ["worst relative difference to one process", f"{fmt(f['worst_relative_diff'], '.2e')} ({f['worst_tensor']})"],
        ["tolerance", fmt(f["tolerance"], "g")],
        ["samples/s: 2 trainers / one process", f"{fmt(f['samples_per_s'])} / {fmt(f['one_process_samples_per_s'])}"],
    ]
    return table(["", ""], rows)


SECTIONS = {
    "tests": _tests,
    "exactness": _exactness,
    "bench": _bench,
    "beyond": _beyond,
    "data-parallel": _data_parallel,
}


def body(results: dict, level: int) -> list[str]:
    """Every step's section under headings of ``level`` (``#`` count)."""
    e = results["environment"]
    h = "#" * level
    if e["gpu"]:
        where = e["gpu"]
    elif e["device"] == "cuda":
        where = "a CUDA GPU (its name could not be read)"
    else:
        where = f"{e['device']} (no GPU: a dry run, no GPU figure)"
    out = [f"Measured {results['started']} on {where}, torch {e['torch']} (CUDA {fmt(e['torch_cuda'])}), "
           f"Python {e['python']}, {e['cpus']} CPUs, commit {fmt(e.get('commit'))}; size `{results['size']}`, "
           f"{results['total_s']:.0f} s in all.", ""]  # fmt: skip
    rows = [[s["name"], s["status"], f"{s['seconds']:.1f} / {s['limit_s']:.0f}"] for s in results["steps"]]
    out += table(["step", "status", "s (taken / limit)"], rows)
    for s in results["steps"]:
        out += ["", f"{h} {s['title']}", ""]
        r = s["result"]
        if r is None or "figures" not in r and s["name"] != "tests":
            why = (
                "stopped at its limit" if s["status"].startswith("stopped") else f"failed (exit code {s['returncode']})"
            )
            out.append(f"{why} after {s['seconds']:.0f} s, before it wrote a result; see gpu-check.log.")
            continue
        out += SECTIONS[s["name"]](r if s["name"] == "tests" else r["figures"])
        if s["status"] != "passed":
            out += ["", f"Step {s['status']}; see gpu-check.log."]
    return out


def markdown(results: dict) -> str:
    """``results.md``."""
    return "\n".join(["# gpu-check results", "", *body(results, 2)]) + "\n"


BEGIN = "<!-- gpu-check: begin (written by python -m bagpipe.gpucheck.docs) -->"
END = "<!-- gpu-check: end -->"


def docs_section(results: dict) -> str:
    """The text between :data:`BEGIN` and :data:`END` in docs/gpu.md."""
    return "\n".join(["", *body(results, 4), ""])
