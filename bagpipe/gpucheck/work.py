"""The bodies of the gpu-check's steps, each run in a child process of its own:
``python -m bagpipe.gpucheck.work STEP --device D --size S --dir DIR`` writes DIR/result.json.

Every result has ``passed`` (bool) and ``figures`` (what the report shows); device
memory figures are torch's peak allocated / reserved bytes on the GPU, None elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from bagpipe.checkpoint.compare import checkpoint_tensors, worst_difference
from bagpipe.gpucheck.sizes import SIZES, Size
from bagpipe.jsonout import json_text

MIB = 1 << 20
#: eval log loss agreement of a GPU run with the same run on the CPU (docs/gpu.md)
CPU_TOLERANCE = 1e-4
#: data-parallel trainers against one process, relative to each tensor's scale (docs/distributed.md)
DP_TOLERANCE = 1e-5
#: the design promises bitwise equal digests to the CPU's only where the device computes
#: with the CPU's kernels (the twin); a GPU's kernels differ in the last bits
SAME_KERNELS_AS_CPU = {"cpu-async": True, "cuda": False}


def on_cuda(device: str) -> bool:
    return device.startswith("cuda")


def reset_peak(device: str) -> None:
    if on_cuda(device):
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> dict:
    """Device memory peaks since :func:`reset_peak`, MiB (None off a GPU)."""
    if not on_cuda(device):
        return {"peak_allocated_mb": None, "peak_reserved_mb": None}
    return {
        "peak_allocated_mb": torch.cuda.max_memory_allocated() / MIB,
        "peak_reserved_mb": torch.cuda.max_memory_reserved() / MIB,
    }


def tiny_data(size: Size, where: Path) -> str:
    from bagpipe.data.synthetic import SynthConfig, generate

    if not (where / "meta.json").exists():
        generate(SynthConfig(profile="tiny", samples=size.samples, seed=1), where, progress=False)
    return str(where)


def run_one(device: str, out: Path, **settings) -> dict:
    """One ``bagpipe train`` run in this process; the summary's figures this check reports."""
    from bagpipe.config.train import TrainConfig, only_applicable
    from bagpipe.train.loop import train

    reset_peak(device)
    s = train(TrainConfig.of(**only_applicable(settings | {"device": device, "out": str(out), "progress": False})))
    assert s is not None
    return {
        "device": s["device"],
        "params_sha256": s.get("params_sha256"),
        "eval_logloss": s.get("eval_logloss"),
        "samples_per_s": s["samples_per_s"],
        "rows_fetched": (s.get("cache") or {}).get("rows_fetched"),
    } | peak(device)


def exactness(size: Size, device: str, work: Path) -> dict:
    """``full`` with every table on the device against the cached modes with the cache on
    the device and the store in host memory and on disk, and a hot tier; the same
    settings' ``full`` and ``lookahead`` on the CPU."""
    data = tiny_data(size, work / "data")
    base: dict = dict(data=data, steps=size.steps, batch_size=size.batch_size, lr=0.05, seed=7, eval_samples=2048,
                model="dlrm", optimizer="adagrad")  # fmt: skip
    cached: dict = dict(cache_rows=size.cache_rows, lookahead=size.lookahead)
    runs: dict[str, dict] = {
        "full": dict(mode="full"),
        "lookahead/memory": dict(mode="lookahead", store="memory", **cached),
        "lookahead/disk": dict(mode="lookahead", store="disk", **cached),
        "lru/memory": dict(mode="lru", store="memory", **cached),
        "nocache/memory": dict(mode="nocache", store="memory"),
        "lookahead/memory+hot": dict(mode="lookahead", store="memory", hot_budget_mb=size.hot_budget_mb, **cached),
    }
    on_device = {k: run_one(device, work / "runs" / k.replace("/", "-"), **base, **v) for k, v in runs.items()}
    ref = on_device["full"]["params_sha256"]
    for r in on_device.values():
        r["equal_to_full"] = r["params_sha256"] == ref
    cpu = {
        k: run_one("cpu", work / "cpu" / k.replace("/", "-"), **base, **runs[k]) for k in ("full", "lookahead/memory")
    }
    bitwise = SAME_KERNELS_AS_CPU.get(device, False)
    against_cpu = {}
    for k, c in cpu.items():
        d = on_device[k]
        diff = abs(d["eval_logloss"] - c["eval_logloss"])
        same = d["params_sha256"] == c["params_sha256"]
        against_cpu[k] = {
            "promise": "bitwise equal" if bitwise else f"eval log loss within {CPU_TOLERANCE:g}",
            "params_equal": same,
            "eval_logloss_diff": diff,
            "passed": same if bitwise else diff <= CPU_TOLERANCE,
        }
    passed = all(r["equal_to_full"] for r in on_device.values()) and all(a["passed"] for a in against_cpu.values())
    return {
        "passed": passed,
        "figures": {
            "deterministic_algorithms": True,
            "steps": size.steps,
            "batch_size": size.batch_size,
            "runs": on_device,
            "cpu": cpu,
            "against_cpu": against_cpu,
        },
    }


def device_peaks(peaks: Path) -> dict[str, dict]:
    """``mode/store`` -> the device memory peak its training process wrote (peakhook)."""
    by_run: dict[str, dict] = {}
    for f in sorted(peaks.glob("*.json")):
        p = json.loads(f.read_text())
        argv = p["argv"]
        if "--mode" in argv:
            store = argv[argv.index("--store") + 1] if "--store" in argv else "memory"
            by_run[f"{argv[argv.index('--mode') + 1]}/{store}"] = {
                "peak_allocated_mb": p["max_allocated_bytes"] / MIB,
                "peak_reserved_mb": p["max_reserved_bytes"] / MIB,
            }
    return by_run


def bench_rows(res: dict, peaks: dict[str, dict]) -> dict[str, dict]:
    """The figures of one ``bench modes`` results.json this check reports, by ``mode/store``."""
    rows = {}
    for key, r in res["results"].items():
        threads = (r.get("threads_per_step_ms") or [{}])[0] or {}
        hit = r.get("hit_rate")
        rows[key] = {
            "samples_per_s": r["samples_per_s"],
            "ratio_to_full": r.get("ratio_to_full"),
            "time_per_step_ms": r["time_per_step_ms"],
            "hit_rate": None if hit != hit else hit,  # NaN: full has none
            "pipeline_cpu_ms": r.get("pipeline_cpu_ms"),
            "trainer_cpu_ms": (threads.get("trainer") or {}).get("cpu"),
            "host_threads_cpu_ms": {k: v.get("cpu") for k, v in threads.items()},
        } | peaks.get(key, {"peak_allocated_mb": None, "peak_reserved_mb": None})
    return rows


def bench(size: Size, device: str, work: Path) -> dict:
    """``bagpipe bench modes`` on the device at each of ``size.bench_batches``; every
    training process's device memory peak through :mod:`bagpipe.gpucheck.peakhook` (the
    benchmark's summaries have none). result.json is rewritten after each batch size, so
    a step stopped at its limit keeps the batch sizes it finished."""
    bench_device = device if on_cuda(device) else "cpu"  # the benchmark has no cpu-async: the dry run measures cpu
    hook = Path(__file__).parent / "peakhook"
    runs = []
    for batch in size.bench_batches:
        peaks = work / f"device-peaks-{batch}"
        peaks.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, BAGPIPE_DEVICE_PEAK_DIR=str(peaks))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p)
        out = work / f"bench-{batch}"
        cmd = [sys.executable, "-m", "bagpipe", "bench", "modes", "--device", bench_device, "--out", str(out),
               "--batch-size", str(batch), *size.bench_args]  # fmt: skip
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, check=True)
        res = json.loads((out / "results.json").read_text())
        c = res.get("config") or {}
        keys = ("profile", "scale", "recipe", "batch_size", "steps", "warmup", "cache_fraction", "lookahead")
        runs.append({"config": {k: c.get(k) for k in keys}, "total_rows": res.get("total_rows"),
                     "cache_rows": res.get("cache_rows"), "results": bench_rows(res, device_peaks(peaks))})  # fmt: skip
        result = {
            "passed": len(runs) == len(size.bench_batches),
            "figures": {"bench_device": bench_device, "runs": runs},
        }
        (work / "result.json").write_text(json_text(result, indent=1, default=str))
        shutil.rmtree(out / "data", ignore_errors=True)  # the generated data set: GBs at full cardinality
    return result


def beyond(size: Size, device: str, work: Path) -> dict:
    """A run whose tables are larger than its device budget: ``--mode full`` refused in one
    line, ``lookahead`` (the cache on the device, the rows in host memory) trained at its
    steady speed with its device peak under the budget."""
    from bagpipe.data.synthetic import SynthConfig, generate
    from bagpipe.errors import ConfigError
    from bagpipe.models import recipe
    from bagpipe.optim.names import row_state_dim

    data = work / "data"
    if not (data / "meta.json").exists():
        generate(SynthConfig(profile="criteo-kaggle", samples=size.beyond_samples, scale=size.beyond_scale, seed=1),
                 data, progress=False)  # fmt: skip
    from bagpipe.data.schema import DatasetMeta

    rows = DatasetMeta.load(data).total_rows
    dim = recipe("dlrm", size.beyond_recipe).embedding_dim
    tables_mb = rows * 4 * (dim + row_state_dim("adagrad", dim)) / MIB
    budget = size.beyond_budget_mb
    base = dict(data=str(data), steps=size.beyond_steps, batch_size=size.beyond_batch, recipe=size.beyond_recipe,
                optimizer="adagrad", lr=0.05, seed=1, eval_samples=size.beyond_batch, digest=False,
                final_checkpoint=False, warmup_steps=max(1, size.beyond_steps // 5),
                device_memory_budget_mb=budget)  # fmt: skip
    try:
        run_one(device, work / "full", mode="full", **base)
        refusal = None
    except ConfigError as e:
        refusal = str(e)
    r = run_one(device, work / "lookahead", mode="lookahead", store="memory", **base)
    under = r["peak_reserved_mb"] is None or r["peak_reserved_mb"] <= budget
    return {
        "passed": refusal is not None and tables_mb > budget and under,
        "figures": {
            "rows": rows,
            "tables_mb": tables_mb,
            "budget_mb": budget,
            "full_refused": refusal,
            "steps": size.beyond_steps,
            "batch_size": size.beyond_batch,
            "lookahead": r,
            "peak_under_budget": under if r["peak_reserved_mb"] is not None else None,
        },
    }


def data_parallel(size: Size, device: str, work: Path) -> dict:
    """2 trainers (sharing the one device) and 1 embedding server against one process's
    ``full`` on the device (SGD, docs/distributed.md's tolerance)."""
    data = tiny_data(size, work / "data")
    common = ["--data", data, "--steps", size.steps, "--batch-size", size.batch_size, "--optimizer", "sgd",
              "--lr", 0.05, "--seed", 7, "--eval-samples", 2048, "--no-progress", "--device", device]  # fmt: skip
    dist = work / "two-trainers"
    cmd = [sys.executable, "-m", "bagpipe", "train", *map(str, common), "--out", str(dist), "--mode", "lookahead",
           "--cache-rows", str(size.cache_rows), "--lookahead", str(size.lookahead), "--trainers", "2",
           "--servers", "1"]  # fmt: skip
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    ref = run_one(device, work / "one-process", mode="full", data=data, steps=size.steps, batch_size=size.batch_size,
                  optimizer="sgd", lr=0.05, seed=7, eval_samples=2048)  # fmt: skip
    worst, name = worst_difference(checkpoint_tensors(dist), checkpoint_tensors(work / "one-process"))
    s = json.loads((dist / "summary.json").read_text())
    return {
        "passed": worst <= DP_TOLERANCE,
        "figures": {
            "trainers": 2,
            "servers": 1,
            "trainer_backend": (s.get("distributed") or {}).get("trainer_backend"),
            "worst_relative_diff": worst,
            "worst_tensor": name,
            "tolerance": DP_TOLERANCE,
            "samples_per_s": s.get("samples_per_s"),
            "one_process_samples_per_s": ref["samples_per_s"],
        },
    }


def gpu_tests(size: Size, device: str, work: Path) -> dict:
    """The ``gpu``-marked tests, the long matrix last (their outcomes: the runner reads
    this step's output, which is pytest's)."""
    rcs = []
    for expr in (f"not {size.tests_last}", size.tests_last):
        cmd = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider", "-k", expr, *size.tests]
        print("$ " + " ".join(cmd), flush=True)
        rcs.append(subprocess.run(cmd).returncode)
    return {"passed": all(rc in (0, 5) for rc in rcs), "pytest_exit_codes": rcs}  # 5: none selected


BODIES = {"tests": gpu_tests, "exactness": exactness, "bench": bench, "beyond": beyond, "data-parallel": data_parallel}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bagpipe.gpucheck.work", description=__doc__)
    p.add_argument("step", choices=sorted(BODIES))
    p.add_argument("--device", required=True, choices=("cuda", "cpu-async"))
    p.add_argument("--size", required=True, choices=sorted(SIZES))
    p.add_argument("--dir", required=True, type=Path, help="the step's folder (result.json goes there)")
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    result = BODIES[args.step](SIZES[args.size], args.device, args.dir)
    (args.dir / "result.json").write_text(json_text(result, indent=1, default=str))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
