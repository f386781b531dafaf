"""HTTPLM's first contact (the probe): its independent requests side by side against one at a time, in one run.

    python benchmarks/bench_probe.py [--delays 0,0.1 --rounds 3]

Our server (`BackgroundServer`, SmolLM2-135M from the packaged GGUF) is probed directly and through a proxy on
127.0.0.1 that holds each request `delay` seconds before forwarding it (a server far away: its round trip). Each
client is probed with the local tokenizer and with the server's /tokenize; "one at a time" replaces
`probe.side_by_side` with a loop, so both send the same requests. Reports the best of `rounds` seconds per
construction, the requests sent and the ratio; both must find the same settings.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved_best, print_table, write_rows  # noqa: E402


def delaying_proxy(upstream: str, delay: float) -> tuple[str, ThreadingHTTPServer]:
    """A proxy on 127.0.0.1 that forwards every request to `upstream` after `delay` seconds."""
    root = upstream.rsplit("/v1", 1)[0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def forward(self, data):
            time.sleep(delay)
            request = urllib.request.Request(root + self.path, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as r:
                payload = r.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            self.forward(None)

        def do_POST(self):
            self.forward(self.rfile.read(int(self.headers["Content-Length"])))

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}/v1", httpd


def one_at_a_time(*calls):
    return [call() for call in calls]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", default="0,0.1", help="seconds each request is held (0: our server directly)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.jsonl"))
    args = ap.parse_args()

    import replug_jax as rj
    from replug_jax.lm.http import probe
    from replug_jax.lm.http.client import HTTPLM
    from replug_jax.serve import BackgroundServer

    lm = rj.load_lm("smollm2")
    side_by_side = probe.side_by_side
    rows = []
    with BackgroundServer(lm) as server:
        HTTPLM(server.url, tokenizer=lm.tokenizer)  # warm: the server's programs compiled
        for delay in [float(d) for d in args.delays.split(",")]:
            url, proxy = delaying_proxy(server.url, delay) if delay else (server.url, None)
            for tokenizer in ("local", "server /tokenize"):
                found, requests = {}, {}

                def construct(mode, tokenizer=tokenizer):
                    probe.side_by_side = side_by_side if mode == "side by side" else one_at_a_time
                    try:
                        client = HTTPLM(url, tokenizer=lm.tokenizer if tokenizer == "local" else None)
                    finally:
                        probe.side_by_side = side_by_side
                    stats = client.stats()
                    requests[mode] = stats.pop("requests")
                    found[mode] = json.dumps(stats, sort_keys=True)

                best = interleaved_best({m: (lambda m=m: construct(m)) for m in ("one at a time", "side by side")},
                                        args.rounds)
                assert found["one at a time"] == found["side by side"], found
                rows.append({"bench": "probe", "delay_s": delay, "tokenizer": tokenizer,
                             "requests": requests["side by side"], "one_at_a_time_s": best["one at a time"],
                             "side_by_side_s": best["side by side"],
                             "speedup": best["one at a time"] / best["side by side"]})
                print(rows[-1], flush=True)
            if proxy is not None:
                proxy.shutdown()
    print_table(rows, ["delay_s", "tokenizer", "requests", "one_at_a_time_s", "side_by_side_s", "speedup"])
    write_rows([{**r, "command": "python " + " ".join(sys.argv)} for r in rows], args.out)


if __name__ == "__main__":
    main()
