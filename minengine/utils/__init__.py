"""Small helpers under vLLM's names and paths, so vLLM scripts run with their imports changed:
``minengine.utils.argparse_utils.FlexibleArgumentParser`` (vLLM 0.33's path) and, as older vLLM had it,
``minengine.utils.FlexibleArgumentParser``."""

from minengine.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
