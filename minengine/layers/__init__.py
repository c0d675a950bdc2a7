"""Layers of the model forward: paged attention, rotary embedding, RMSNorm."""
