"""One module per `hetauto` subcommand: `add_arguments(parser)` and `run(args) -> int`."""
