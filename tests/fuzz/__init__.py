"""Property fuzz of every ``primal`` verb, run in-process through ``primal_compiler.cli.main``.

What is guaranteed (README "Outputs, errors and signals", ``docs/outputs.md``), for every generated
invocation:

- the exit code is 0, 2, 130 or 143: never 70 (an internal error) nor 1;
- stderr holds at most one line on success, besides the progress lines some verbs print
  (:data:`tests.fuzz.harness.PROGRESS`); a failure is exactly one line ``primal: ...``, no traceback and
  no usage block. argparse's refusals are that line too, in one form:
  ``primal: VERB: argument --flag: ... (primal VERB --help lists the options)`` (or
  ``primal: command line: unrecognized arguments: ... (primal --help lists the options)``), exit 2;
- nothing outside the output path changed: a scratch tree is snapshotted before and after and compared
  everywhere but the output path (and, on success, the parents it needed). A failed invocation changes
  nothing at all, and no temporary sibling (``.NAME.primal-tmp.*``, ``.NAME.primal-old.*``) is left.

How, one module per kind of input (each states its own properties):

- :mod:`.harness`: running one invocation under a time budget, the snapshot, the checks above;
- :mod:`.test_destinations`: every writing verb pointed at every kind of destination;
- :mod:`.argv` and :mod:`.test_options`: a small valid command line per verb, mutated;
- :mod:`.test_refusals`: the explicit refusals (an option with no effect, an empty path, a bad address);
- :mod:`.test_traces`: ``primal serve`` on fuzzed trace files and trace paths that are not files;
- :mod:`.test_adapters`: fuzzed ``adapter_config.json`` and adapter tensors;
- :mod:`.test_config_files`: fuzzed target and pipeline files through the CLI.

A broken guarantee fails its test at once (there is no switch to only record it).
"""
