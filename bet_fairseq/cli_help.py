"""Make ``fairseq-train --user-dir bet_fairseq --help`` list this plugin's options.

fairseq prints ``--help`` during its *first* parse, before any model, task or criterion has added
its options, so a plugin's options are never shown. Only when help is asked for (``-h``/``--help``
on the command line), we wrap ``fairseq.options.parse_args_and_arch`` so that it first adds our
option groups to the parser it is about to print. A normal run is untouched.
"""

import sys

from fairseq.dataclass.utils import gen_parser_from_dataclass

# (group title, dataclass) pairs shown in --help; modules add theirs with register_help().
_HELP_GROUPS = []


def register_help(title, dataclass_cls):
    _HELP_GROUPS.append((title, dataclass_cls))


def _help_requested(argv) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def add_options_to_fairseq_help(argv=None):
    if not _help_requested(sys.argv[1:] if argv is None else argv):
        return
    from fairseq import options

    original = options.parse_args_and_arch
    if getattr(original, "_bet_help", False):
        return

    def parse_args_and_arch(parser, *args, **kwargs):
        for title, dc in _HELP_GROUPS:
            gen_parser_from_dataclass(parser.add_argument_group(title), dc())
        return original(parser, *args, **kwargs)

    parse_args_and_arch._bet_help = True
    options.parse_args_and_arch = parse_args_and_arch
