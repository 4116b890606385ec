"""A Flask 3 application served by werkzeug as `flask run` serves it, on one thread (``threaded=False``: a
thread per request is the sampling's own subject, issue 41.1), with clients in other processes requesting its
page in a loop, enough of them that a request always waits (the server is busy however slowly the machine
wakes its clients): the page's view formats and sorts rows in Python, as a view does. Prints the port, then
serves and requests for SECONDS."""
import logging
import subprocess
import sys
import time
import urllib.request

from flask import Flask, jsonify
from werkzeug.serving import make_server

app = Flask(__name__)
CLIENTS = 3


def score(row):
    return sum(ord(ch) for ch in row["name"]) % 97


@app.route("/rows")
def rows_view():
    rows = [{"id": i, "name": "row %d of the page" % i} for i in range(300)]
    return jsonify(sorted(rows, key=score))


def client(url, until):
    while time.time() < until:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
        except OSError:  # a connection the loaded machine's server reset: the next one
            time.sleep(0.01)


def main(seconds):
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    until = time.time() + seconds
    server = make_server("127.0.0.1", 0, app, threaded=False)
    url = "http://127.0.0.1:%d/rows" % server.server_port
    print(server.server_port, flush=True)
    clients = [subprocess.Popen([sys.executable, __file__, "--client", url, repr(until)]) for _ in range(CLIENTS)]
    server.timeout = 0.5
    while time.time() < until:
        server.handle_request()
    for client_process in clients:
        client_process.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        client(sys.argv[2], float(sys.argv[3]))
    else:
        main(float(sys.argv[1]))
