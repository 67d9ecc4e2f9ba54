"""A fault-injecting HTTP proxy in front of the moto server (stdlib only, in a daemon thread):
it logs every request (method, path, Range, status, body bytes) and answers with the fault a
``policy(request)`` chooses, so every S3 client (s3fs, obstore's own HTTP stack) sees the same
failures: None (forward), 500 or 503 (an S3 error), ``"stall"`` (the request is read, no answer
ever comes: a silent endpoint, or a write that never completes), ``"drip"`` (the upstream's
headers at once, then its body :attr:`FaultProxy.drip_bytes` bytes every
:attr:`FaultProxy.drip_every` seconds: a connection that always makes a little progress) or
``"drip-headers"`` (the whole answer so, status line and headers included: a write's answer
has no body)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.policy = lambda req: None
        self.log: list[dict] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()  # ends stalls and drips at close()
        self.drip_bytes, self.drip_every = 4, 0.2
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                req = {
                    "method": self.command,
                    "path": self.path,
                    "range": self.headers.get("Range"),
                }
                with proxy.lock:
                    proxy.log.append(req)
                fault = proxy.policy(req)
                req["fault"] = fault
                if fault in _S3_ERRORS:
                    code, msg = _S3_ERRORS[fault]
                    x = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>{msg}</Message><RequestId>fault</RequestId></Error>"
                    ).encode()
                    req.update(status=fault, nbytes=0)
                    self.send_response(fault)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(x)))
                    self.end_headers()
                    self.wfile.write(x)
                    return
                if fault == "stall":  # the request was read; no answer (until reset/close)
                    req.update(status=None, nbytes=0)
                    proxy.stopped.wait(600)
                    self.close_connection = True
                    return
                c = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                skip = ("connection", "keep-alive")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                c.request(self.command, self.path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                c.close()
                if fault in ("drip", "drip-headers"):
                    self._drip(r, data, req, headers_too=fault == "drip-headers")
                    return
                self.send_response(r.status)
                dropped = ("connection", "transfer-encoding", "content-length", "server", "date")
                for k, v in r.getheaders():
                    if k.lower() not in dropped:
                        self.send_header(k, v)
                # (a HEAD keeps the object's size)
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                req.update(status=r.status, nbytes=len(data) if self.command != "HEAD" else 0)
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _drip(self, r, data, req, headers_too):
                """The upstream's answer (its body, or all of it), a few bytes at a time
                (until reset() or close())."""
                head = [f"HTTP/1.1 {r.status} {r.reason}"]
                dropped = ("connection", "transfer-encoding", "content-length", "server", "date")
                head += [f"{k}: {v}" for k, v in r.getheaders() if k.lower() not in dropped]
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                head += [f"Content-Length: {length or len(data)}", "Connection: close", "", ""]
                raw = "\r\n".join(head).encode("latin-1")
                if self.command != "HEAD":
                    raw += data
                self.close_connection = True
                sent, stopped = 0, proxy.stopped
                try:
                    if not headers_too:
                        sent = raw.index(b"\r\n\r\n") + 4
                        self.wfile.write(raw[:sent])
                        self.wfile.flush()
                    while sent < len(raw) and not stopped.is_set():
                        self.wfile.write(raw[sent : sent + proxy.drip_bytes])
                        self.wfile.flush()
                        sent += proxy.drip_bytes
                        time.sleep(proxy.drip_every)
                except OSError:  # the client gave up
                    pass
                req.update(status=r.status, nbytes=min(sent, len(raw)))

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # (a client's burst of connections is never turned away)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests(self, method: str = "GET", suffix: str = "") -> list[dict]:
        with self.lock:
            return [
                r
                for r in self.log
                if r["method"] == method and r["path"].split("?")[0].endswith(suffix)
            ]

    def reset(self) -> None:
        """No faults, an empty log; stalls and drips under way end."""
        with self.lock:
            self.log.clear()
        self.policy = lambda req: None
        self.stopped.set()
        self.stopped = threading.Event()

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
