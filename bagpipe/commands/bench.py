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
defaults; --quick shrinks any scenario to under a minute (tables at 1% size, few steps).

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
            f"--quick runs it in under a minute: {quick}",
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
    check_out(b.out, f"{args.scenario}.png")
    from bagpipe.bench.harness.runner import TrainFailed
    from bagpipe.errors import BagpipeError

    try:
        payload = s.run(b)
    except TrainFailed as e:  # a run the scenario does not expect to fail: its own one line, not a traceback
        said = [ln for ln in e.stderr.splitlines() if ln.strip()]
        why = said[-1].removeprefix("bagpipe train: error: ") if said else f"exit code {e.returncode}"
        raise BagpipeError(f"bench {args.scenario}: its run {e.label} failed: {why}") from None
    print(payload["table"])
    if payload.get("identical") is False:  # convergence: full and lookahead must learn identically
        print("full and lookahead differ: exactness violated (see results.json)")
        return 1
    print(f"results in {b.out}/results.json, results.md and PNG plots")
    return 0


def check_out(out, picture: str | None = None) -> None:
    """Refuse, in one line and before anything runs, an ``--out`` that is (or lies under) a
    file, whose results.json / results.md are not an earlier bench's, or whose ``picture``
    (the scenario's plot, NAME.png) is a file bagpipe did not write: they used to be
    replaced without a word (a file there was a traceback naming OUT/data)."""
    import json
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
    for name in ("results.json", "results.md"):
        if (out / name).is_file() and not ours:
            raise ConfigError(
                f"--out {out}: {out / name} exists and is not an earlier bench's results; it is not replaced: "
                "choose another --out"
            )
    why = foreign_picture(out / picture, "png") if picture else None
    if why is not None:  # a user's photo of that name
        raise ConfigError(f"--out {out}: {out / picture}: {refusal(why)}: choose another --out")
