"""Alias package (see ``minengine.v1``)."""
