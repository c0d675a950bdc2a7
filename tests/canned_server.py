"""Canned HTTP servers on loopback for the step-feed client's tests: fixed bytes, then an abrupt close or an
open connection; and the events of a tiny fake minengine feed."""

from __future__ import annotations

import json
import socketserver
import threading
import time

from minengine.metrics.trace import ScheduledChunk, StepTrace


class CannedServer:
    """A loopback HTTP server that answers every request with ``head`` then each of ``chunks`` (bytes), then
    either closes the connection at once (``close=True``: abruptly, mid-body) or holds it open until stopped."""

    def __init__(self, head: bytes, chunks: list[bytes] = (), close: bool = True):
        release = self.release = threading.Event()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                data = b""
                while b"\r\n\r\n" not in data:
                    more = self.request.recv(4096)
                    if not more:
                        return
                    data += more
                self.request.sendall(head)
                for chunk in chunks:
                    self.request.sendall(chunk)
                    time.sleep(0.01)
                if not close:
                    release.wait(30)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def http_head(status: str = "200 OK", content_type: str = "text/event-stream", chunked: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-type: {content_type}", "connection: close"]
    if chunked:
        lines.append("transfer-encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(text: str) -> bytes:
    body = text.encode()
    return f"{len(body):x}\r\n".encode() + body + b"\r\n"


ENGINE = {"model": "fake", "block_size": 4, "num_kv_blocks": 8, "max_num_batched_tokens": 16, "max_num_seqs": 2,
          "clock": "wall"}


def step_dict(step: int, num_dropped: int = 0) -> dict:
    rid = "cmpl-0123456789abcdef0123456789abcdef-0"
    tr = StepTrace(step=step, start_time=10.0 + step, end_time=10.5 + step, token_budget=16,
                   chunks=[ScheduledChunk(rid, 1, 4 + step, False, True)], num_running=1, num_waiting=0,
                   num_free_blocks=6, num_cached_free_blocks=0, num_total_blocks=8, preempted_ids=[],
                   admitted_ids=[], finished_ids=[], prefix_queried_tokens=0, prefix_hit_tokens=0,
                   block_tables={rid: [0, 1]}, block_ref_counts=[1, 1, 0, 0, 0, 0, 0, 0], cached_block_ids=[])
    return {**tr.to_dict(), "duration": 0.5, "num_dropped": num_dropped}


def sse(event: str, data) -> str:
    return f"event: {event}\ndata: {json.dumps(data) if not isinstance(data, str) else data}\n\n"
