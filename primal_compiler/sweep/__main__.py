"""``python -m primal_compiler.sweep SPEC.toml -o RESULTS ...`` (same as ``primal sweep``)."""

import sys

from primal_compiler.cli import main

sys.exit(main(["sweep", *sys.argv[1:]]))
