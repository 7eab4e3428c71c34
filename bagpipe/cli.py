"""The ``bagpipe`` command line: one subcommand per module in :mod:`bagpipe.commands`.

Library code raises :class:`bagpipe.errors.BagpipeError`; this is the only place that
turns those into a one-line message and an exit code.
"""

from __future__ import annotations

import os
import signal
import sys


def _take_sigint() -> None:
    """SIGINT to :func:`bagpipe.interrupts.interrupt` (KeyboardInterrupt, which :func:`main`
    turns into one line, never lost in the import machinery), also where the process
    inherited it ignored -- ``cmd &`` in a script, a scheduler's job -- so that Ctrl-C
    (``kill -INT``) stops any command from here on, also during the imports below and the
    command's own (seconds: torch); a SIGINT before this, in the interpreter's start-up, is
    lost. Later, :func:`bagpipe.lifeline.stop_cleanly` takes SIGINT over where a run writes
    what must not be left half-written, as before."""
    from bagpipe.interrupts import install

    install()


# First thing, before any import that takes time (and a SIGINT ignored meanwhile would be lost).
_take_sigint()

# Before torch loads OpenMP: idle OpenMP workers sleep instead of spinning. With the
# prefetch pipeline's threads on the same cores, spinning workers starve them and a
# descheduled worker stalls every parallel region (measured on 2 cores with a busy
# background thread: a DLRM step took 3.7x longer with the default ACTIVE policy).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch's C++ side would print its own multi-line reports (with stack frames) of the
# errors bagpipe already turns into one line (a peer that is gone, a rendezvous that
# timed out); set TORCH_CPP_LOG_LEVEL=INFO to see them.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

# Only what the module's own definitions need: a Ctrl-C during these imports, before
# main() runs, would still end in a traceback (difflib, logging: imported where used).
import argparse  # noqa: E402
import importlib  # noqa: E402
from collections.abc import Callable, Collection, Iterator, Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402

from bagpipe.errors import BagpipeError, ConfigError  # noqa: E402

# name -> (module, one-line summary). Each module defines add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("bagpipe.commands.synth", "generate a skewed synthetic CTR dataset"),
    "preprocess": ("bagpipe.commands.preprocess", "convert raw Criteo / Avazu / Taobao logs to shards"),
    "profile": ("bagpipe.commands.profile", "find a dataset's hot rows for a memory budget (FAE's profiler)"),
    "train": ("bagpipe.commands.train", "train a model (reference, cached or lookahead mode)"),
    "plan": ("bagpipe.commands.plan", "what a training run would need in memory, part by part, and whether it fits"),
    "eval": ("bagpipe.commands.eval", "evaluate a finished run on a dataset"),
    "check": ("bagpipe.commands.check", "check every file of a dataset against its meta.json"),
    "plot": ("bagpipe.commands.plot", "draw loss and AUC curves of runs to a PNG"),
    "export": ("bagpipe.commands.export", "export a run as safetensors with its vocabulary"),
    "predict": ("bagpipe.commands.predict", "score raw log lines with an exported model"),
    "bench": ("bagpipe.commands.bench", "run a benchmark scenario side by side"),
    "serve": ("bagpipe.commands.serve", "start one embedding server of a distributed job"),
    "worker": ("bagpipe.commands.worker", "run one role of a distributed job (launcher / torchrun)"),
}

DESCRIPTION = """\
bagpipe trains recommendation models (DLRM, DeepFM, Wide & Deep, DCN) whose embedding
tables are far larger than a trainer's memory, with exactly the result of plain
synchronous training.

Typical session:
  bagpipe synth --profile tiny --samples 50000 --out data/tiny
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/a
  bagpipe eval --run runs/a --data data/tiny
  bagpipe plot runs/a runs/b --out curves.png
  bagpipe export --run runs/a --out exports/a
  bagpipe predict --model exports/a --input raw.tsv --out raw.pred   (raw logs: data from bagpipe preprocess)

Run `bagpipe COMMAND --help` for the options of each command.
"""


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``bagpipe train: error: argument --steps:
    invalid int value: 'x' (see bagpipe train --help)``, exit code 2, as every other
    bagpipe error."""

    #: While True (inside :func:`parse`), :meth:`error` raises :class:`_Refused` instead of exiting.
    _hold = False

    def error(self, message: str):  # noqa: D102 - argparse's hook
        if Parser._hold:
            raise _Refused(self, message)
        self.exit(2, one_line(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")

    def _check_value(self, action: argparse.Action, value) -> None:
        """argparse's check of a value against its choices, the one closest to a value outside
        them offered: ``invalid choice: 'traim' (choose from ...); did you mean train?`` (a
        command, ``bench``'s scenario, an option's value)."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            near = closest(str(value), [str(c) for c in action.choices or ()])
            if near is None:
                raise
            raise argparse.ArgumentError(action, f"{e.message}; did you mean {near}?") from None


class _Refused(Exception):
    """A usage error of ``parser`` held back by :func:`parse` (it may name a better one)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


def closest(typed: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` closest to ``typed`` (a misspelling of it), or None (the helper a
    config file's keys and values use too; imported here only when a usage error needs it)."""
    from bagpipe.config.typed import closest as near

    return near(typed, known)


def one_line(text: str) -> str:
    """``text`` as one printable line: newlines folded, characters the terminal cannot
    encode (a non-UTF-8 file name arrives as surrogates) written as escapes."""
    text = " ".join(str(text).split("\n"))
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; ``load``: the commands whose modules are imported and
    whose options are added (None: all). The others are listed by name and summary only,
    so ``bagpipe --version``, ``bagpipe --help`` and ``bagpipe COMMAND ...`` import no
    module but the one they run (a command's module may import torch: seconds)."""
    parser = Parser(prog="bagpipe", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        if load is not None and name not in load:
            sub.add_parser(name, help=summary)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # command not built yet
            raise
        p = sub.add_parser(
            name,
            help=summary,
            description=getattr(module, "DESCRIPTION", summary),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` (the arguments after ``bagpipe``) runs: its first argument that
    is not an option (``bagpipe`` itself takes no option with a value), if it names one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, where an argument no parser knows is reported by the
    (sub)command it was given to -- ``bagpipe train: error: unrecognized arguments: --bogus
    (see bagpipe train --help)``, ``bagpipe bench modes: ...`` -- not by ``bagpipe`` itself,
    whose help lists no command's options; an option close to one the command has is
    offered (``did you mean --steps?``). Such an option is named also where argparse would
    report a required option as missing first (``bagpipe eval --runs r``: ``unrecognized
    arguments: --runs; did you mean --run?``, not ``the following arguments are required: --run``)."""
    Parser._hold = True
    try:
        args, extra = parser.parse_known_args(argv)
    except _Refused as refused:
        Parser._hold = False
        strays = stray_options(parser, argv) if refused.message.startswith(REQUIRED) else None
        if strays is not None:
            where, names = strays
            where.error(unrecognized(where, names))
        refused.parser.error(refused.message)
        raise AssertionError("unreachable: error() exits") from None  # pragma: no cover
    finally:
        Parser._hold = False
    if not extra:
        return args
    argv = list(argv)
    command = command_of(argv)
    before = argv[: argv.index(command)] if command is not None else argv
    # given after the command: the command's (or its scenario's, `bench modes`), else bagpipe's own
    chosen = parser if any(a in before for a in extra) else chosen_parser(parser, args)
    chosen.error(unrecognized(chosen, extra))
    raise AssertionError("unreachable: error() exits")  # pragma: no cover


#: How argparse's message on a required argument that was not given begins.
REQUIRED = "the following arguments are required"


def unrecognized(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """The message on arguments ``parser`` does not take, with the option of its closest to
    the first of them that is an option."""
    typed = next((a.split("=", 1)[0][2:] for a in extra if a.startswith("--")), None)
    near = None
    if typed:  # compared without the dashes every option shares
        shown = [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]  # not hidden ones
        near = closest(typed, [o[2:] for o in shown if o.startswith("--")])  # (bench sweep offered oracle's, round 23)
    return f"unrecognized arguments: {' '.join(extra)}" + (f"; did you mean --{near}?" if near else "")


def stray_options(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.ArgumentParser, list[str]] | None:
    """The ``--options`` of ``argv`` that the (sub)parser they were given to does not take
    -- neither one of its options nor the start of one, as argparse lets an option be
    abbreviated -- with that parser (the first such parser's, if several); None if none.
    An argument belongs to the innermost parser whose command (``train``, ``bench modes``)
    comes before it; after ``--`` every argument is a value."""
    current, found = parser, None
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            own = _options(current)
            if name in own or (current.allow_abbrev and any(o.startswith(name) for o in own)):
                continue
            if found is None:
                found = (current, [name])
            elif found[0] is current:
                found[1].append(name)
        elif not arg.startswith("-"):
            subs = _subparsers(current)
            if subs is not None and arg in subs.choices:
                current = subs.choices[arg]
    return found


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for action in parser._actions for o in action.option_strings]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)parser ``args`` were parsed by: ``bagpipe bench modes``'s for
    ``bagpipe bench modes ...`` (each level's choice is its subparsers' ``dest`` in ``args``)."""
    while True:
        subs = _subparsers(parser)
        name = getattr(args, subs.dest, None) if subs is not None and subs.dest else None
        if subs is None or name not in subs.choices:
            return parser
        parser = subs.choices[name]


def _version() -> str:
    from bagpipe import __version__

    return f"bagpipe {__version__}"


def main(argv: list[str] | None = None) -> int:
    """Run ``bagpipe ARGV`` (``sys.argv`` when None: the program itself) and return its exit code.

    Ctrl-C at any moment from here on -- while the command's modules are imported (torch:
    seconds), its options parsed, or it runs -- ends in one line, ``bagpipe train:
    interrupted``, exit 130 (a SIGTERM or SIGHUP a run turned into the same unwinding:
    ``stopped by SIGTERM``, 128 + the signal), no traceback."""
    command = command_of(sys.argv[1:] if argv is None else argv)
    try:
        if argv is None:  # the program: started by bagpipe (a role, a spare, a bench run), it ends with its parent
            from bagpipe import lifeline

            lifeline.watch(f"bagpipe {command}" if command else "bagpipe")
        rc = _main(argv)
    except KeyboardInterrupt as e:
        rc = _stopped(command, e)
    except Exception:  # a bug: Python's traceback, and past a stuck thread as after any error
        if argv is None:
            import traceback

            _leave_past_stuck_threads(1, say=traceback.print_exc)
        raise
    if argv is None:
        # the command is done and has said so: a Ctrl-C in the interpreter's teardown (joining
        # threads, closing files) killed the process with status 130 and no word (newcomer
        # round 16, a run whose summary and final checkpoint were written); ignored from here,
        # and Python's finalization keeps an ignored SIGINT ignored. SIGTERM and SIGHUP too: their
        # default action there ended a finished run with status 143 and no word (round 18)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        _leave_past_stuck_threads(rc)
    return rc


def _stopped(command: str | None, e: KeyboardInterrupt) -> int:
    """Say in one line that ``bagpipe COMMAND`` was stopped by ``e`` (Ctrl-C, or a stop
    signal :func:`bagpipe.lifeline.stop_cleanly` unwound as Ctrl-C); its exit code."""
    who = f"bagpipe {command}" if command else "bagpipe"
    signum = getattr(e, "signum", None)  # lifeline.Terminated: SIGTERM or SIGHUP
    try:
        print(f"{who}: {f'stopped by {signal.Signals(signum).name}' if signum else 'interrupted'}", file=sys.stderr)
    except (OSError, ValueError):  # stderr gone (a closed pipe): the exit code says it
        pass
    return 128 + signum if signum else 130


def _leave_past_stuck_threads(rc: int, say: Callable[[], None] | None = None) -> None:
    """End the process now, with ``rc``, if :func:`_stuck_threads` (after ``say``: what the
    process would print on its way out). Left to the interpreter's shutdown, such a thread is
    unwound through C++ frames that do not allow it, and the process aborts (SIGABRT) after
    its one-line error instead of exiting with it."""
    if _stuck_threads(rc):
        if say is not None:
            say()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _stuck_threads(rc: int) -> bool:
    """Whether a thread is still blocked inside torch's C++ code: a rendezvous given up on (a
    TCPStore client waiting for an answer that never comes), or, after an error (``rc`` != 0),
    a thread inside a receive of the transport (:func:`bagpipe.distributed.transport.receiving_elsewhere`)."""
    import threading

    if any(t.is_alive() and t.name == "bagpipe-rendezvous" for t in threading.enumerate()):
        return True
    transport = sys.modules.get("bagpipe.distributed.transport")  # not imported: no thread inside a receive
    return rc != 0 and transport is not None and transport.receiving_elsewhere()


def _main(argv: list[str] | None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    command = command_of(argv)
    parser = build_parser(load=[command] if command is not None else [])
    args = parse(parser, argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    _tolerate_unencodable_output()
    from bagpipe.log import to_terminal

    # the library's notices reach the terminal (a role's with the time, for its log)
    to_terminal(timestamps=args.command in ("worker", "serve"))
    try:
        refuse_a_limit_too_small_to_start(args.command)
        with _children_end_with_bench(args.command == "bench"):
            return int(args._run(args) or 0)
    except BagpipeError as e:
        print(one_line(f"bagpipe {args.command}: error: {e}{_from_config(args, str(e))}"), file=sys.stderr)
        return 2
    except BrokenPipeError:  # `bagpipe ... | head`: the reader left; nothing to report
        sys.stderr.close()
        return 0
    except ValueError as e:
        if "embedded null byte" not in str(e):
            raise
        # a NUL byte in a path (a config file's "\u0000"; argv from a shell cannot hold one):
        # the first system call that met it raised, wherever that was
        print(
            one_line(
                f"bagpipe {args.command}: error: a path given holds a NUL byte (\\0), which no file name can; "
                "give another path"
            ),
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        from bagpipe.files import FULL_ERRNOS, WRITE_ERRNOS

        said = _path_error(e)
        if said is not None:  # a path no file system takes, wherever a check or a write met it
            print(one_line(f"bagpipe {args.command}: error: {said}"), file=sys.stderr)
            return 2
        if e.errno not in WRITE_ERRNOS:
            raise
        # a full disk or a volume made read-only under a write that nothing closer to it
        # reported: one line naming the file (the atomic writers name their target, not
        # their temporary file, which they removed)
        where = e.filename if e.filename is not None else "an output file"
        print(
            one_line(
                f"bagpipe {args.command}: error: cannot write {where} ({e.strerror or e}); "
                + ("free some space or choose another path" if e.errno in FULL_ERRNOS else "choose another path")
            ),
            file=sys.stderr,
        )
        return 2


def _from_config(args: argparse.Namespace, message: str) -> str:
    """Where a refusal names an option whose value came from ``--config`` (train, plan,
    worker), the note that says so (:func:`bagpipe.config.train.file_setting_note`)."""
    file = getattr(args, "config", None)
    if not file or args.command not in ("train", "plan", "worker"):
        return ""
    from bagpipe.config import given
    from bagpipe.config.train import TrainConfig, file_setting_note

    try:
        return file_setting_note(message, file, given(args, TrainConfig))
    except Exception:  # noqa: BLE001 - a note never turns a one-line refusal into a traceback
        return ""


def _path_error(e: OSError) -> str | None:
    """One line for a path that cannot name a file at all -- a name longer than the file
    system takes, a loop of symbolic links -- or None (newcomer round 21: each was a
    traceback from whichever check first looked at the path; the options a command
    writes are refused before, :func:`bagpipe.files.refuse_unnamable`)."""
    import errno

    from bagpipe.files import TOO_LONG, shown_path

    why = {
        errno.ENAMETOOLONG: TOO_LONG,
        errno.ELOOP: "its symbolic links form a loop (a link that leads back to itself)",
    }.get(e.errno or 0)
    if why is None:
        return None
    return f"{shown_path(e.filename) if e.filename is not None else 'a path given'}: {why}; give another path"


#: The commands that import torch before they can check a memory budget.
TORCH_COMMANDS = frozenset({"train", "plan", "eval", "export", "predict", "profile", "bench", "serve", "worker"})
#: The smallest memory cgroup limit such a command starts in, MiB: importing torch and
#: bagpipe (the libraries' pages counted in the group) was OOM-killed at 150 MiB and
#: reached the budget's own one-line refusal at 160 MiB (measured, 2-core CPU machine,
#: torch 2.13 CPU build; the peak RSS of that import alone: 221 MiB, some pages shared).
START_MIB = 160


def refuse_a_limit_too_small_to_start(command: str) -> None:
    """A command that imports torch, in a memory cgroup too small to import it, is refused
    in one line now: the kernel would end it during the import, before it could say why."""
    if command not in TORCH_COMMANDS:
        return
    from bagpipe.budget.cgroup import own_limit

    limit, where = own_limit()
    if limit is not None and limit < START_MIB * 2**20:
        raise ConfigError(
            f"this process's memory limit is {limit / 2**20:,.0f} MiB ({where}); starting `bagpipe {command}` "
            f"(torch's import) needs about {START_MIB} MiB before any run: raise the limit"
            + (" (`bagpipe plan` prints what a run needs)" if command != "plan" else "")
        )


@contextmanager
def _children_end_with_bench(bench: bool) -> Iterator[None]:
    """For ``bagpipe bench``: every process it starts (training runs, helpers) inherits
    :data:`bagpipe.lifeline.ENV` naming it, so a ``kill -9`` of the benchmark ends them too."""
    if not bench:
        yield
        return
    from bagpipe import lifeline

    before = os.environ.get(lifeline.ENV)
    os.environ[lifeline.ENV] = lifeline.token()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(lifeline.ENV, None)
        else:
            os.environ[lifeline.ENV] = before


def _tolerate_unencodable_output() -> None:
    """A path that is not UTF-8 (surrogates in Python) printed to stdout must not end a
    finished command with a UnicodeEncodeError: write it escaped instead."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper's; not every stand-in has it
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


if __name__ == "__main__":
    sys.exit(main())
