"""``python -m verify_attn VERB``: the command line lives in the tooling package
(verify_attn_tools, next to this package in a checkout; never installed per commit)."""

from verify_attn_tools.cli import main

raise SystemExit(main())
