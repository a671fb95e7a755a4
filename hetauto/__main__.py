"""`python -m hetauto ...`: the `hetauto` command, for machines where only an interpreter is on PATH (the scripts
hetauto launch writes run `python3 -m hetauto node`)."""

from hetauto.cli import main

raise SystemExit(main())
