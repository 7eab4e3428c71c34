"""CLI subcommands. Each module defines ``DESCRIPTION``, ``add_arguments(parser)`` and
``run(args) -> int`` and is registered in :data:`bagpipe.cli.COMMANDS`."""
