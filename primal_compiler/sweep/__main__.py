"""``python -m primal_compiler.sweep SPEC.toml -o RESULTS ...`` (same as ``primal sweep``)."""

import sys

from primal_compiler.sweep.command import main

sys.exit(main())
