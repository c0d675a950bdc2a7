"""``python -m minengine fleet-serve``: N ``minengine serve`` replicas behind vLLM's router, as one endpoint.

The router is ``vllm-router`` (vLLM's Rust load balancer, a Python wheel; its policies ``round_robin``,
``power_of_two``, ``cache_aware`` ...), not a home-made one: it forwards the OpenAI API to its workers and checks
their ``/health``. The replicas listen on consecutive ports after the router's and share the machine's cores
(each gets ``cores // N`` torch threads, at least 1, so they do not fight over them). With ``worker_urls`` only
the router runs, in front of replicas started on other machines.

Stopping (SIGTERM, or Ctrl-C) stops the router first, so no new request reaches a replica, then every replica
with SIGTERM: each drains its requests in flight (``serve --shutdown-timeout``) before it exits.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import psutil

from minengine.entrypoints.server_process import ServerProcess, ServerStartError, child_env, free_port

ROUTER_PACKAGE = "vllm-router"  # the pip package; its module is vllm_router
POLICIES = ("round_robin", "power_of_two", "cache_aware", "random")  # vllm-router's names for its policies


class FleetStartError(RuntimeError):
    """A replica or the router did not come up; the message names which, with its last output."""


def replica_threads(num_replicas: int, cores: int | None = None) -> int:
    """Torch threads per replica: ``cores // num_replicas``, at least 1 (``cores``: those this process may use).

    Raises:
        ValueError: ``num_replicas`` < 1.
    """
    if num_replicas < 1:
        raise ValueError(f"--num-replicas must be >= 1, got {num_replicas}")
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, cores // num_replicas)


def check_port_free(host: str, port: int) -> None:
    """Raises ``ValueError`` naming ``host:port`` when something already listens there (or it is out of range)."""
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range 1..65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ValueError(f"port {port} on {host} is in use ({exc.strerror}): pick another --port") from None


def free_ports(count: int) -> int:
    """A port P with P .. P+count-1 all free on 127.0.0.1 now (a fleet takes consecutive ports: the router's, then
    each replica's). Raises ``RuntimeError`` when 50 tries found none."""
    for _ in range(50):
        base = free_port()
        try:
            for p in range(base, base + count):
                check_port_free("127.0.0.1", p)
        except ValueError:
            continue
        if base + count < 65536:
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


def router_command(worker_urls: list[str], host: str, port: int, policy: str, log_level: str = "info",
                   extra: list[str] | None = None) -> list[str]:
    """The command line that starts vllm-router on ``host:port`` in front of ``worker_urls`` with ``policy``.
    The router's own Prometheus exporter listens on a port the OS says is free unless ``extra`` names one
    (``--prometheus-port``): its fixed default, 29000, would make a second fleet on the machine fail to start.

    Raises:
        ValueError: ``vllm-router`` is not installed (names the pip package), an unknown policy, power-of-two
            with fewer than 2 workers, or a worker URL that is not http(s)://.
    """
    if importlib.util.find_spec("vllm_router") is None:
        raise ValueError(f"the router is not installed: pip install {ROUTER_PACKAGE} (requirements.txt lists it)")
    if policy not in POLICIES:
        raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "power_of_two" and len(worker_urls) < 2:  # the router refuses it at start
        raise ValueError("--policy power_of_two picks the less loaded of two workers: it needs at least 2")
    for url in worker_urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--worker-urls: {url!r} is not an http:// or https:// URL")
    extra = list(extra or [])
    if not any(arg.startswith("--prometheus-port") for arg in extra):
        extra += ["--prometheus-port", str(free_port())]
    return [sys.executable, "-m", "vllm_router.launch_router", "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--log-level", log_level, *extra]


def wait_url_healthy(url: str, timeout_s: float, alive=lambda: True) -> None:
    """Until ``url/health`` answers 200. Raises ``FleetStartError`` after ``timeout_s`` seconds, or as soon as
    ``alive()`` is false (the process behind it exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise FleetStartError(f"{url} exited before answering /health")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise FleetStartError(f"{url} did not answer /health within {timeout_s:.0f} s")


def stop_process_tree(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM ``process``, SIGKILL after ``timeout_s``; then SIGKILL any child it left behind."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
    for child in children:  # a worker or compiler the process did not reap (it should have)
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=timeout_s)


@dataclass
class FleetArgs:
    """One fleet: ``num_replicas`` local replicas (``serve_args`` each) or the remote ``worker_urls``.

    Attributes:
        serve_args: the ``minengine serve`` arguments of every local replica (model, engine flags).
        num_replicas: local replicas to start (ignored with ``worker_urls``).
        worker_urls: replicas already running elsewhere (``http://host:port``): only the router starts.
        host: the router's interface (0.0.0.0: all); local replicas listen on 127.0.0.1 only, behind it, and
            keep their last 40 output lines (shown when one fails). Replicas on another machine are started there
            with ``serve --host 0.0.0.0``.
        port: the router's port; local replica i listens on ``port + 1 + i``.
        policy: the router's policy (vllm-router's names).
        router_log_level: the router's log level.
        router_args: more vllm-router flags (e.g. ``--cache-threshold 0.5``).
        startup_timeout_s: seconds to wait for every replica's and the router's ``/health``.
        shutdown_timeout_s: seconds each process gets after SIGTERM before SIGKILL.
    """

    serve_args: list[str]
    num_replicas: int = 2
    worker_urls: list[str] | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "round_robin"
    router_log_level: str = "info"
    router_args: list[str] | None = None
    startup_timeout_s: float = 300.0
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the flag of a value out of range."""
        if self.worker_urls is None:
            replica_threads(self.num_replicas)  # checks the count
        last = self.port + (0 if self.worker_urls is not None else self.num_replicas)
        if not 0 < self.port <= last < 65536:
            raise ValueError(f"--port {self.port}: the router and replicas need ports {self.port}..{last} within "
                             f"1..65535")
        for flag, value in (("--startup-timeout", self.startup_timeout_s),
                            ("--shutdown-timeout", self.shutdown_timeout_s)):
            if not 0 < value <= 86_400:
                raise ValueError(f"{flag} must be in (0, 86400] seconds, got {value}")


class Fleet:
    """The processes of one fleet: ``start()`` brings up the replicas, then the router; ``stop()`` ends them all
    (also as a context manager: ``with Fleet(args) as fleet: ...``).

    Attributes:
        url: the router's base URL, the fleet's one endpoint.
        worker_urls: the replicas' base URLs, as given to the router.
        replicas: the local replicas (``ServerProcess``; empty with ``worker_urls``).
        router: the router's ``subprocess.Popen`` (None before ``start``).
        router_output: the router's last output lines.

    Raises:
        ValueError: bad settings or a port in use (before anything starts).
        FleetStartError: from ``start``: a replica or the router did not come up (its last output in the
            message); what had started is stopped.
    """

    def __init__(self, args: FleetArgs):
        self.args = args
        remote = args.worker_urls is not None
        if remote and not args.worker_urls:
            raise ValueError("--worker-urls needs at least one URL")
        ports = [args.port] if remote else [args.port + i for i in range(1 + args.num_replicas)]
        local = "127.0.0.1"
        self.worker_urls = list(args.worker_urls) if remote else [f"http://{local}:{p}" for p in ports[1:]]
        self._router_cmd = router_command(self.worker_urls, args.host, args.port, args.policy,
                                          args.router_log_level, args.router_args)
        for i, p in enumerate(ports):
            check_port_free(args.host if i == 0 else local, p)
        host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
        self.url = f"http://{host}:{args.port}"
        self.replicas: list[ServerProcess] = []
        self.router: subprocess.Popen | None = None
        self.router_output: collections.deque[str] = collections.deque(maxlen=40)

    def start(self) -> Fleet:
        """The replicas (or a wait for the remote ones' ``/health``), then the router; returns ``self``. Raises
        ``FleetStartError`` (everything started is stopped first)."""
        try:
            if self.args.worker_urls is None:
                self._start_replicas()
            else:
                for url in self.worker_urls:
                    wait_url_healthy(url, self.args.startup_timeout_s)
            self._start_router()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_replicas(self) -> None:
        """All replicas at once (their model loads overlap), then each one's ``/health`` in turn."""
        a = self.args
        threads = replica_threads(a.num_replicas)
        extra = [] if "--num-cpu-threads" in a.serve_args else ["--num-cpu-threads", str(threads)]
        for i in range(a.num_replicas):
            self.replicas.append(ServerProcess([*a.serve_args, *extra], port=a.port + 1 + i, wait=False,
                                               env={"OMP_NUM_THREADS": str(threads)}))
        for i, replica in enumerate(self.replicas):
            try:
                replica.wait_healthy(a.startup_timeout_s, progress_every_s=a.startup_timeout_s + 1)
            except ServerStartError as exc:
                raise FleetStartError(f"replica {i} ({replica.url}) did not start: {exc}") from None

    def _start_router(self) -> None:
        self.router = subprocess.Popen(self._router_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=child_env())
        threading.Thread(target=self._read_router, daemon=True).start()
        try:
            wait_url_healthy(self.url, self.args.startup_timeout_s, alive=lambda: self.router.poll() is None)
        except FleetStartError as exc:
            time.sleep(0.2)  # the reader thread takes the last lines
            tail = "\n".join("    " + line for line in list(self.router_output)[-12:]) or "    (nothing)"
            raise FleetStartError(f"the router: {exc}. Its last output:\n{tail}") from None

    def _read_router(self) -> None:
        for line in self.router.stdout:
            self.router_output.append(line.rstrip("\n"))
            print(f"[router] {line}", end="", flush=True)

    def failure(self) -> str | None:
        """Which process has exited on its own (None while all run)."""
        if self.router is not None and self.router.poll() is not None:
            return f"the router exited with code {self.router.returncode}"
        for i, replica in enumerate(self.replicas):
            if not replica.running:
                tail = "\n".join("    " + line for line in list(replica.output)[-12:])
                return f"replica {i} ({replica.url}) exited with code {replica.process.returncode}:\n{tail}"
        return None

    def pids(self) -> list[int]:
        """The pids of every process of the fleet: the router, the replicas and their children."""
        procs = ([self.router] if self.router is not None else []) + [r.process for r in self.replicas]
        pids = []
        for proc in procs:
            pids.append(proc.pid)
            try:
                pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return pids

    def stop(self) -> None:
        """The router first (no new request reaches a replica), then every replica: each drains what it runs."""
        if self.router is not None:
            stop_process_tree(self.router, self.args.shutdown_timeout_s)
        for replica in self.replicas:  # all at once: their drains overlap
            if replica.running:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            stop_process_tree(replica.process, self.args.shutdown_timeout_s)
            replica.stop()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_fleet(args: FleetArgs) -> int:
    """Start the fleet, print its endpoint, run until SIGTERM / Ctrl-C (0) or until a process dies (1); every
    process is stopped on the way out."""
    fleet = Fleet(args)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        fleet.start()
        print(f"minengine fleet: router ({args.policy}) on {fleet.url} in front of {', '.join(fleet.worker_urls)}"
              " (OpenAI API under /v1; Ctrl-C or SIGTERM stops every process)", flush=True)
        while (failure := fleet.failure()) is None:
            time.sleep(0.5)
        print(f"minengine fleet: {failure}; stopping the others", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the drain short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            fleet.stop()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)


def cmd_fleet_serve(a: argparse.Namespace) -> None:
    serve_args = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    for flag in ("--port", "--host"):
        if flag in serve_args:
            raise ValueError(f"{flag} after the fleet's flags: the fleet sets each replica's port and host")
    if a.worker_urls is not None and serve_args:
        raise ValueError("--worker-urls runs only the router: give the serve arguments to the remote replicas")
    if a.worker_urls is None and not serve_args:
        raise ValueError("give the replicas' serve arguments after the fleet's flags (at least the model), "
                         "or --worker-urls")
    args = FleetArgs(serve_args, a.num_replicas, a.worker_urls, a.host, a.port, a.policy, a.router_log_level,
                     shlex.split(a.router_args), a.startup_timeout, a.shutdown_timeout)
    code = serve_fleet(args)
    if code:
        sys.exit(code)


def add_fleet_parser(sub) -> None:
    """``fleet-serve``: its flags, then ``serve``'s arguments for every replica."""
    f = sub.add_parser("fleet-serve", help="N serve replicas behind vllm-router, as one OpenAI endpoint",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Start N `minengine serve` replicas on ports PORT+1..PORT+N and vllm-router on "
                                   "PORT. Everything after the fleet's flags goes to each replica: "
                                   "`fleet-serve --num-replicas 2 -- MODEL --max-model-len 512`.")
    f.add_argument("--num-replicas", type=int, default=2, help="local replicas (cores split between them)")
    f.add_argument("--worker-urls", nargs="+", default=None, metavar="URL",
                   help="replicas already running elsewhere (http://host:port): start only the router")
    f.add_argument("--host", default="127.0.0.1", help="the router's interface (0.0.0.0: all)")
    f.add_argument("--port", type=int, default=8000, help="the router's port; replica i gets PORT+1+i")
    f.add_argument("--policy", default="round_robin", choices=POLICIES, help="the router's load-balancing policy")
    f.add_argument("--router-log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"], help="vllm-router's log level")
    f.add_argument("--router-args", default="", help="more vllm-router flags, one string ('--cache-threshold 0.5')")
    f.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for each /health")
    f.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds each process gets after SIGTERM before SIGKILL")
    f.add_argument("serve_args", nargs=argparse.REMAINDER, help="`minengine serve` arguments of every replica")
    f.set_defaults(func=cmd_fleet_serve)
