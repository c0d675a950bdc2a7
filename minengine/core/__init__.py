"""The scheduler's world: block pool, KV cache manager, scheduler. No torch in here."""
