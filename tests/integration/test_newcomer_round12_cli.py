"""The twelfth newcomer round's command-line findings: Ctrl-C during start-up, SIGINT
inherited ignored, and misspellings argparse could not match.

* Ctrl-C while a command's modules were imported (the first ~0.3 s) ended in a
  KeyboardInterrupt traceback, the process killed by SIGINT: any moment of ``main`` says
  ``bagpipe train: interrupted``, exit 130, as later. Proved with real processes whose
  import of the command's module is held (a finder on ``sys.meta_path`` that says so and
  waits), so the signal lands inside it every time.
* A process that inherited SIGINT ignored (``cmd &`` in a script) lost a SIGINT of its
  first 1-2 s and trained to the end: ``bagpipe.cli`` restores SIGINT before its own
  imports, and the same held import is interrupted.
* ``bagpipe eval --runs r`` said ``the following arguments are required: --run``: the
  option nobody takes is named, with the one it is close to (``--output`` / ``--out``);
  an abbreviation argparse takes (``--dat``) is not a misspelling. A misspelt command or
  choice (``traim``, ``bench mdoes``, ``preprocess critoe``, ``--model dlrn``) is offered
  the one it is close to.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

# Imports bagpipe.cli, then runs `bagpipe ARGV` as the program does, with the import of the
# command's module held: "importing" is printed, then the import waits (30 s).
HELD_IMPORT = textwrap.dedent(
    """
    import sys, time
    import bagpipe.cli

    class Held:
        def find_spec(self, name, path=None, target=None):
            if name == "bagpipe.commands." + sys.argv[1]:
                sys.meta_path.remove(self)
                print("importing", flush=True)
                time.sleep(30)
            return None

    sys.meta_path.insert(0, Held())
    sys.exit(bagpipe.cli.main())
    """
)


def _held_and_interrupted(argv: list[str], inherited: str) -> tuple[int, str]:
    """Start ``bagpipe ARGV`` with SIGINT at its default or ``inherited`` ignored, send SIGINT
    while the command's module is being imported; (exit code, stderr)."""

    def dispositions() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN if inherited == "ignored" else signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_IMPORT, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=dispositions,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "importing\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("inherited", ["default", "ignored"])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_ctrl_c_while_the_command_is_imported_is_one_line(command, inherited, tmp_path):
    rc, err = _held_and_interrupted([command, "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o")], inherited)
    assert (rc, err) == (130, f"bagpipe {command}: interrupted\n"), err[-2000:]


@pytest.mark.integration
def test_sigint_inherited_ignored_is_restored_before_the_clis_imports():
    """Where SIGINT is restored: before ``bagpipe.cli`` imports anything beyond os, signal
    and sys (its first import after them, argparse, already sees Python's handler)."""
    code = textwrap.dedent(
        """
        import signal, sys
        seen = []

        class Look:
            def find_spec(self, name, path=None, target=None):
                if name == "argparse" and not seen:
                    from bagpipe.interrupts import interrupt
                    seen.append(signal.getsignal(signal.SIGINT) is interrupt)
                return None

        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        sys.modules.pop("argparse", None)
        sys.meta_path.insert(0, Look())
        import bagpipe.cli
        print(seen)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert (r.returncode, r.stdout) == (0, "[True]\n"), r.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_after_the_command_is_done_does_not_turn_it_into_an_interrupt(signame):
    """Newcomer round 16: a run whose summary and final checkpoint were written exited 130
    with no word -- the Ctrl-C landed in the interpreter's teardown, after ``main`` had
    returned. From there on SIGINT is ignored: the command's own exit code stands. Round 18:
    a SIGTERM there ended it with 143 and no word; SIGTERM and SIGHUP are ignored too. (The
    program's ``main``, argv from sys.argv -- plain ``bagpipe``: the help, exit code 2 --
    then the signal, then the interpreter's exit.)"""
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.argv = ["bagpipe"]
        from bagpipe.cli import main
        rc = main()
        os.kill(os.getpid(), signal.{signame})
        sys.exit(rc)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (2, ""), r.stderr[-2000:]
    assert r.stdout.startswith("usage: bagpipe")


# -- misspellings ------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "command", "said"),
    [
        (("eval", "--runs", "r", "--data", "d"), "eval", "unrecognized arguments: --runs; did you mean --run?"),
        (("plot", "r", "--output", "a.png"), "plot", "unrecognized arguments: --output; did you mean --out?"),
        (("eval", "--run=r", "--dta=d"), "eval", "unrecognized arguments: --dta; did you mean --data?"),
        (("eval", "--bogus", "--data", "d"), "eval", "unrecognized arguments: --bogus"),
        # an abbreviation argparse takes is no misspelling: the missing option is said
        (("eval", "--dat", "d"), "eval", "the following arguments are required: --run"),
    ],
)
def test_an_unknown_option_is_named_before_a_required_one_it_hides(run_cli, argv, command, said):
    rc, out, err = run_cli(*argv)
    assert (rc, out) == (2, "")
    assert err == f"bagpipe {command}: error: {said} (see bagpipe {command} --help)\n"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "prog", "said"),
    [
        (("traim",), "bagpipe", "argument COMMAND: invalid choice: 'traim' (choose from "),
        (("bench", "mdoes"), "bagpipe bench", "argument SCENARIO: invalid choice: 'mdoes' (choose from "),
        (("preprocess", "critoe"), "bagpipe preprocess", "argument FORMAT: invalid choice: 'critoe' (choose from "),
        (("train", "--model", "dlrn"), "bagpipe train", "argument --model: invalid choice: 'dlrn' (choose from "),
    ],
)
def test_a_misspelt_choice_is_offered_the_closest(run_cli, argv, prog, said):
    rc, out, err = run_cli(*argv)
    near = {"traim": "train", "mdoes": "modes", "critoe": "criteo", "dlrn": "dlrm"}[argv[-1]]
    assert (rc, out) == (2, "")
    assert err.startswith(f"{prog}: error: {said}"), err
    assert err.endswith(f"); did you mean {near}? (see {prog} --help)\n"), err
    assert err.count("\n") == 1


@pytest.mark.integration
def test_a_choice_close_to_none_is_offered_nothing(run_cli):
    rc, _, err = run_cli("zzzzzz")
    assert rc == 2 and "invalid choice: 'zzzzzz'" in err and "did you mean" not in err
