"""Typed exceptions. Library code raises these; only the CLI turns them into
one-line messages and exit codes."""


class BagpipeError(Exception):
    """Base class of every error bagpipe raises on purpose."""


class ConfigError(BagpipeError):
    """A configuration value is invalid or inconsistent with the data."""


class DataError(BagpipeError):
    """A dataset or input file is missing, malformed or inconsistent."""


class ParseError(DataError):
    """A line of a raw input file could not be parsed.

    Carries the file, the 1-based line number and what was wrong, so the message
    reads ``file:line: problem``.
    """

    def __init__(self, path: str, line: int, problem: str):
        self.path = str(path)
        self.line = int(line)
        self.problem = problem
        super().__init__(f"{self.path}:{self.line}: {problem}")


class CapacityError(BagpipeError):
    """A cache is too small for what it must hold (e.g. one batch's unique rows)."""


class CheckpointError(BagpipeError):
    """A checkpoint is missing, corrupt, or does not match the run."""


class WriteError(BagpipeError):
    """A file could not be written (a full disk); the message names it and says what
    survived and how to go on."""
