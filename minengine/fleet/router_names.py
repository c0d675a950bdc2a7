"""The routers' names, in the order tables list them (a leaf module: ``FleetConfig`` validates a name against it
without importing the routers, and ``minengine.fleet.routers`` checks at import that its registry has exactly these).
"""

ROUTER_NAMES: tuple[str, ...] = ("round-robin", "random", "power-of-two", "least-outstanding-tokens",
                                 "least-kv-usage", "cache-aware", "prefix-aware", "conductor")
