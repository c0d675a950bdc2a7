"""The serving front: an OpenAI-compatible HTTP server around one engine loop.

``async_engine.py`` (``AsyncLLMEngine``: one loop owns the engine, callers enqueue and await), ``protocol.py``
(the OpenAI request and response models), ``openai_server.py`` (FastAPI routes), ``chat_utils.py`` (chat
templates), ``bench_client.py`` (``bench-serve --base-url``: drive any OpenAI-compatible server).
"""
