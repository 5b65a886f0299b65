"""The help formatter every command shares, the trainer's included.

Kept on the bottom floor (not in ``fsdpmon.cli``, the dispatch) so that ``fsdpmon.trainer`` can
format its ``--help`` the same way without importing the command dispatch.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; each option's help ends with its default.

    Options whose help already names its default, and those defaulting to None/False (no value
    unless given), are left as they are.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or text == argparse.SUPPRESS
                or default is None or default is False or default == argparse.SUPPRESS
                or default == []):
            return text
        return f"{text} (default: %(default)s)"
