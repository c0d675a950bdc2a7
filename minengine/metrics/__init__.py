"""Serving metrics (TTFT, TPOT, ITL percentiles, throughput) and the per-step trace."""
