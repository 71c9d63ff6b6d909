"""``primal disasm`` and ``primal asm``: a compiled program as assembly text and back (docs/isa.md)."""

from __future__ import annotations

import argparse
import sys

from primal_compiler.argtypes import path_arg, unused
from primal_compiler.outdir import check_destination, output_file


def cmd_disasm(args) -> None:
    from primal_compiler.isa.container import load_program, program_path
    from primal_compiler.isa.text import disasm

    if args.output is None and args.force:
        raise unused("--force", "-o FILE")
    if args.output is not None:
        check_destination(args.output, args.force, directory=False, inputs=(args.program,))
    text = disasm(*load_program(program_path(args.program)))
    if args.output is None:
        sys.stdout.write(text)
    else:
        with output_file(args.output, args.force, inputs=(args.program,)) as f:
            f.write(text.encode("utf-8"))


def cmd_asm(args) -> None:
    from primal_compiler.inputs import PROGRAM_LIMIT_BYTES, read_text
    from primal_compiler.isa.container import save_program
    from primal_compiler.isa.text import asm

    check_destination(args.output, args.force, directory=False, inputs=(args.text,))
    text = read_text(args.text, PROGRAM_LIMIT_BYTES, "program text")
    meta, arrays, stream = asm(text, where=args.text)
    save_program(args.output, meta, arrays, stream, args.force, inputs=(args.text,))
    print(f"wrote {args.output} ({len(stream)} records, {stream.num_groups} groups, {len(stream.sections)} sections)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``disasm`` and ``asm`` on the CLI's subcommands."""
    sp = sub.add_parser("disasm", help="print a compiled program as assembly text")
    sp.add_argument("program", type=path_arg, help="program file, or a compile output directory holding program.primal")
    sp.add_argument("-o", "--output", default=None, help="write the text to this file instead of stdout")
    sp.add_argument("--force", action="store_true", help="replace FILE if it exists")
    sp.set_defaults(func=cmd_disasm)

    sp = sub.add_parser("asm", help="assemble text (as printed by disasm) into a program file")
    sp.add_argument("text", type=path_arg, help="assembly text file")
    sp.add_argument("-o", "--output", required=True, help="program file to write")
    sp.add_argument("--force", action="store_true", help="replace FILE if it exists")
    sp.set_defaults(func=cmd_asm)
