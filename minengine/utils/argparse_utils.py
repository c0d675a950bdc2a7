"""vLLM's ``vllm.utils.argparse_utils``: ``FlexibleArgumentParser``."""

from __future__ import annotations

import argparse
import sys


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's ``FlexibleArgumentParser``: an ``argparse.ArgumentParser`` that also accepts ``--flag_name`` for
    ``--flag-name`` (vLLM's scripts and users write both)."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        fixed = []
        for a in args:
            if a.startswith("--"):
                name, sep, value = a.partition("=")
                a = name.replace("_", "-") + sep + value
            fixed.append(a)
        return super().parse_known_args(fixed, namespace)
