"""HTTP servers for tests and benchmarks: a real `transformers serve` subprocess, and a scripted OpenAI-style server.

`TransformersServer(model_dir, log).start()` runs `transformers serve MODEL --host 127.0.0.1 --port P` (about 10 s to
start here) and waits for `/health`; `ScriptedServer(respond)` answers every request with `respond(path, body)` from a
thread of this process, so a test decides each reply (JSON, status codes, delays) and sees every request.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServer:
    """`transformers serve` on 127.0.0.1, pinned to one local model; `stop()` and `start()` again to restart it."""

    def __init__(self, model_dir: str | Path, log_path: str | Path, port: int | None = None):
        self.model_dir, self.log_path = str(model_dir), Path(log_path)
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process = None

    def start(self, timeout: float = 120.0) -> "TransformersServer":
        cli = Path(sys.executable).with_name("transformers")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [str(cli), "serve", self.model_dir, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"transformers serve did not become healthy in {timeout:.0f} s (exit code "
                           f"{self.process.returncode}); log:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def completed_requests(self) -> int:
        """Completions answered with 200 so far, from uvicorn's access log."""
        return self.log_path.read_text().count('"POST /v1/completions HTTP/1.1" 200')


class ScriptedServer:
    """An OpenAI-style server whose every reply comes from `respond(path, body) -> (status, payload[, delay_s])`.

    `requests` lists `(method, path, body, headers)` of everything received, in order of arrival.
    """

    def __init__(self, respond):
        self.respond, self.requests, self.lock = respond, [], threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body):
                with server.lock:
                    server.requests.append((self.command, self.path, body, dict(self.headers)))
                status, payload, *delay = server.respond(self.path, body)
                if delay:
                    time.sleep(delay[0])
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def do_GET(self):
                self._answer(None)

            def do_POST(self):
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self, path: str) -> list[dict]:
        with self.lock:
            return [body for method, p, body, _ in self.requests if method == "POST" and p.endswith(path)]
