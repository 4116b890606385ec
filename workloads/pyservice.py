"""A Python web service whose every request burns a known amount of CPU, served the ways Python services run:
a thread per request (the standard library's ThreadingHTTPServer, as socketserver and werkzeug serve), Flask's
own server (werkzeug, ``threaded=True``, as ``flask run`` serves), or any WSGI server (``application``, e.g.
gunicorn's pre-fork workers: ``gunicorn --chdir workloads pyservice:application``).

Each request runs ``handle_burn``, which spins until the thread has used MS milliseconds of its own CPU time
(PYSERVICE_MS, default 3), then answers. Ground truth for the sampling of short-lived threads
(tests/record/test_thread_churn.py, bench/bench_services.py): the server's samples follow its CPU time,
and most of them are in handle_burn.

    python3 pyservice.py [--flask] [--ms 3] [--port-file PATH]   # prints "port N" once listening
    python3 pyservice.py --load PORT SECONDS [--connections N]    # a client: N requests in flight at a time
"""
import argparse
import http.client
import os
import sys
import threading
import time

MS = float(os.environ.get("PYSERVICE_MS", "3"))


def handle_burn(ms):
    """Spin until this thread has used ``ms`` milliseconds of CPU time."""
    end = time.thread_time() + ms / 1000
    spins = 0
    while time.thread_time() < end:
        spins += 1
    return spins


def application(environ, start_response):
    """The WSGI form (gunicorn, waitress...)."""
    body = str(handle_burn(MS)).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def serve_threads(port_file):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = str(handle_burn(MS)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    announce(server.server_address[1], port_file)
    server.serve_forever()


def serve_flask(port_file):
    import logging
    import socket

    from flask import Flask

    app = Flask("pyservice")
    app.add_url_rule("/", "burn", lambda: str(handle_burn(MS)))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    announce(port, port_file)
    app.run(host="127.0.0.1", port=port, threaded=True)


def announce(port, port_file):
    print(f"port {port}", flush=True)
    if port_file:
        with open(port_file + ".tmp", "w") as out:
            out.write(str(port))
        os.rename(port_file + ".tmp", port_file)


def load(port, seconds, connections):
    """``connections`` clients, each sending requests one after another for ``seconds`` (a new connection
    each: a new thread each on a thread-per-request server), so the server has work while a client waits
    for the CPU on a busy machine; prints how many were answered."""
    end = time.monotonic() + seconds
    done = []

    def client():
        count = 0
        while time.monotonic() < end:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                connection.request("GET", "/")
                connection.getresponse().read()
                connection.close()
                count += 1
            except OSError:
                time.sleep(0.01)  # not listening yet, or a worker restarting
        done.append(count)

    clients = [threading.Thread(target=client) for _ in range(connections)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    print(sum(done), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flask", action="store_true")
    parser.add_argument("--ms", type=float)
    parser.add_argument("--port-file")
    parser.add_argument("--load", nargs=2, type=float, metavar=("PORT", "SECONDS"))
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    global MS
    if args.ms is not None:
        MS = args.ms
    if args.load:
        load(int(args.load[0]), args.load[1], args.connections)
    elif args.flask:
        serve_flask(args.port_file)
    else:
        serve_threads(args.port_file)


if __name__ == "__main__":
    sys.exit(main())
