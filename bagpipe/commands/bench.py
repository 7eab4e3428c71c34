"""``bagpipe bench SCENARIO``: one subcommand per entry of :data:`bagpipe.bench.registry.SCENARIOS`.

Each scenario's options are generated from its settings class (shared ones and its
own, with that scenario's defaults); an option only other scenarios have is refused
with one line naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect

DESCRIPTION = """\
Run a benchmark scenario; every compared configuration runs in the same invocation,
interleaved over repetitions, and the results land in OUT as results.json,
results.md (a table with ratios) and PNG plots.

`bagpipe bench SCENARIO --help` explains a scenario and lists its options with its
defaults; --quick shrinks any scenario to a small size (tables at 1% size, few steps):
seconds to about two minutes on a 2-core machine (recovery and approx take the longest:
95 s each measured for recovery --quick and approx --quick: recovery restarts fresh processes).

Examples:
  bagpipe bench modes --out bench-out/modes
  bagpipe bench modes --stores disk --modes full,nocache,lru,lookahead
  bagpipe bench oracle --quick
  bagpipe bench peers --scale 0.1 --reps 3 --modes full,lookahead,torchrec
  bagpipe bench sweep --cache-percents 1,5,20 --lookaheads 1,50
  bagpipe bench distributed --modes in-process,1x2
  bagpipe bench convergence --quick --no-criteo
"""


class _Elsewhere(argparse.Action):
    """An option that only other scenarios have: remembered here, refused by :func:`run`."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.elsewhere = namespace.elsewhere or option_string


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.bench.harness.settings import show
    from bagpipe.bench.registry import SCENARIOS
    from bagpipe.config import add_options
    from bagpipe.config.options import flag

    every = {k: v for s in SCENARIOS.values() for k, v in s.config.option_strings().items()}
    sub = p.add_subparsers(dest="scenario", metavar="SCENARIO", required=True, title="scenarios")
    for name, s in SCENARIOS.items():
        cls = s.config
        quick = " ".join(f"{flag(k)} {show(v)}" for k, v in cls.QUICK.items())
        sp = sub.add_parser(
            name,
            help=s.about,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=f"bagpipe bench {name}: {s.about}.\n\n{inspect.cleandoc(cls.__doc__ or '')}\n\n"
            f"--quick runs it at a small size (seconds to about two minutes on 2 cores): {quick}",
        )
        sp.add_argument("--quick", action="store_true", help="the small size of this scenario (see above)")
        own = cls.own_fields()
        add_options(sp, cls, titles={"": "options shared with other scenarios"}, skip=own)
        shared = tuple(f.name for f in dataclasses.fields(cls) if f.name not in own)
        add_options(sp, cls, titles={"": f"{name} options"}, skip=shared)
        mine = cls.option_strings()
        for opt, takes_value in every.items():
            if opt not in mine:
                sp.add_argument(
                    opt,
                    action=_Elsewhere,
                    nargs="?" if takes_value else 0,
                    dest="elsewhere",
                    default=None,
                    help=argparse.SUPPRESS,
                )


def run(args: argparse.Namespace) -> int:
    from bagpipe.bench.registry import SCENARIOS
    from bagpipe.config import given
    from bagpipe.errors import ConfigError

    s = SCENARIOS[args.scenario]
    opt = getattr(args, "elsewhere", None)
    if opt:
        has = [name for name, other in SCENARIOS.items() if opt in other.config.option_strings()]
        raise ConfigError(f"{opt} does not apply to the {args.scenario} scenario (it is an option of {', '.join(has)})")
    values = given(args, s.config)
    b = s.config.quick(**values) if args.quick else s.config(**values)
    check_out(b.out, f"{args.scenario}.png", args.scenario)
    from bagpipe.bench.harness.runner import TrainFailed
    from bagpipe.errors import BagpipeError

    undo = mark_out(b.out)
    try:
        payload = s.run(b)
    except BaseException as e:
        undo()  # a refusal before the scenario made anything leaves OUT as it was
        if not isinstance(e, TrainFailed):
            raise
        # a run the scenario does not expect to fail: its own one line, not a traceback
        said = [ln for ln in e.stderr.splitlines() if ln.strip()]
        why = said[-1].removeprefix("bagpipe train: error: ") if said else f"exit code {e.returncode}"
        raise BagpipeError(f"bench {args.scenario}: its run {e.label} failed: {why}") from None
    print(payload["table"])
    if payload.get("identical") is False:  # convergence: full and lookahead must learn identically
        print("full and lookahead differ: exactness violated (see results.json)")
        return 1
    print(f"results in {b.out}/results.json, results.md and PNG plots")
    return 0


MARK = ".bagpipe-bench.json"
"""The file a bench writes in its --out before it runs: what the folders below are is a bench's."""

DATA_SETS = ("data", "data-generated")
"""OUT's entries a scenario (re)generates with ``bagpipe synth``: a data set there is replaced
only when ``bagpipe synth`` made it."""

WORK = ("data-criteo", "store", "store-template", "store-template-frequency", "store-run", "runs")
"""OUT's entries a scenario removes or replaces whole (its Criteo data, disk tables, runs)."""


def foreign_data(folder) -> str | None:
    """Why the data set folder ``folder`` is not one a bench may replace (None: ``bagpipe synth``
    made it, so a bench may regenerate it)."""
    import json

    try:
        meta = json.loads((folder / "meta.json").read_text())
        tool = (meta.get("source") or {}).get("tool") if isinstance(meta, dict) else None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return "it is not a data set bagpipe generated"
    if (folder / "vocab").exists():
        return f"it is a data set with a vocabulary (made by {tool or 'bagpipe preprocess'})"
    if tool not in ("bagpipe synth", "synth"):
        return f"it is a data set made by {tool}" if tool else "it is a data set bagpipe synth did not make"
    return None


def mark_out(out):
    """Write OUT/.bagpipe-bench.json (making OUT) unless it is there; returns a function that
    removes what this call made again where the scenario then made nothing of its own."""
    import json
    from pathlib import Path

    out = Path(out)
    if (out / MARK).is_file():
        return lambda: None
    made = [p for p in (out, *out.parents) if not p.exists()]
    had = {n for n in (*DATA_SETS, *WORK) if (out / n).exists()}
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text(
        json.dumps(
            {"written_by": "bagpipe bench", "holds": "this folder's data, stores and runs are a bench's"},
            allow_nan=False,
        )
        + "\n"
    )

    def undo() -> None:
        if {n for n in (*DATA_SETS, *WORK) if (out / n).exists()} != had:
            return  # the scenario made its folders: they are a bench's, and the mark says so
        (out / MARK).unlink(missing_ok=True)
        for p in made:  # innermost first
            try:
                p.rmdir()
            except OSError:
                break

    return undo


def check_out(out, picture: str | None = None, scenario: str | None = None) -> None:
    """Refuse, in one line and before anything runs, an ``--out`` that is (or lies under) a
    file, whose results.json / results.md are not an earlier bench's, whose ``picture``
    (the scenario's plot, NAME.png) is a file bagpipe did not write, whose OUT/data (or
    OUT/data-generated) is a data set ``bagpipe synth`` did not make (one preprocessed from
    real logs, say), or which holds a folder a bench removes (OUT/store-template,
    OUT/store-run, OUT/runs, ...) without being a bench's (no OUT/.bagpipe-bench.json, no
    earlier bench's results.json), or which holds anything at all without being a bench's: they used
    to be replaced without a word, or the folder was marked a bench's with a user's files in it.
    An earlier bench's results are replaced only by the same ``scenario`` (another scenario's
    replaced them and left their picture beside: newcomer round 22)."""
    import json
    import os
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.train.plot import foreign_picture, refusal

    if str(out) == "-":  # the command line's name for standard output; a bench writes a folder
        raise ConfigError(
            "--out -: a bench writes a folder (results.json, results.md, plots, its runs' data), not standard "
            "output; give a folder, e.g. --out bench-out/NAME"
        )
    out = Path(out)
    above = next((p for p in (out, *out.parents) if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out}: {above} is a file, not a folder; choose another --out")
    try:
        earlier = json.loads((out / "results.json").read_text())
        ours = isinstance(earlier, dict) and "scenario" in earlier
    except (OSError, ValueError, UnicodeDecodeError):
        ours = False
    if ours and scenario is not None and earlier["scenario"] != scenario:
        raise ConfigError(
            f"--out {out} holds the results of bench {earlier['scenario']}; bench {scenario} would replace them: "
            f"choose another --out (bench {earlier['scenario']} run there again replaces them)"
        )
    for name in ("results.json", "results.md"):
        if (out / name).is_file() and not ours:
            raise ConfigError(
                f"--out {out}: {out / name} exists and is not an earlier bench's results; it is not replaced: "
                "choose another --out"
            )
    for name in (*DATA_SETS, *WORK, "results.json", "results.md", *([picture] if picture else [])):
        if (out / name).is_symlink():  # a bench would write (or remove) through the link, outside OUT
            raise ConfigError(
                f"--out {out}: {out / name} is a symbolic link (to {os.readlink(out / name)}); a bench writes its "
                "own files there and would write through it, so it is not touched: remove the link or choose "
                "another --out"
            )
    for name in DATA_SETS:
        why = foreign_data(out / name) if (out / name).exists() else None
        if why is not None:
            raise ConfigError(
                f"--out {out}: {out / name} exists and {why}; a bench would replace it with generated data, "
                "so it is not touched: move it away or choose another --out"
            )
    if not (ours or (out / MARK).is_file()):
        for name in WORK:
            if (out / name).exists():
                raise ConfigError(
                    f"--out {out}: {out / name} exists and is not a bench's (the folder has no {MARK} nor an "
                    "earlier bench's results.json); a bench would remove it, so it is not touched: move it away "
                    "or choose another --out"
                )
    why = foreign_picture(out / picture, "png") if picture else None
    if why is not None:  # a user's photo of that name
        raise ConfigError(f"--out {out}: {out / picture}: {refusal(why)}: choose another --out")
    if out.is_dir() and not (ours or (out / MARK).is_file()):
        held = sorted((p.name for p in out.iterdir()), key=lambda n: (n.startswith("."), n))  # hidden ones last
        if held:  # a user's folder, a training run: a bench would mix its files in and mark the folder its own
            shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
            raise ConfigError(
                f"--out {out}: the folder is not empty ({shown}) and is not a bench's (no {MARK} nor an earlier "
                "bench's results.json); a bench writes data, stores and runs there, so it is not used: give a new "
                "or empty folder, e.g. --out bench-out/NAME"
            )
