"""Runs inside the sandbox as its first process: listens on 127.0.0.1:3128 and relays each connection to the
Unix socket bound in from outside (which leads only to egressd's proxy), then runs the command and exits
with its status. Standard library only and no egressd imports: it runs under the sandbox's own python3.

    python3 -I -S forwarder.py SOCKET -- COMMAND [ARG...]
"""

import os
import signal
import socket
import subprocess
import sys
import threading

LISTEN = ("127.0.0.1", 3128)
BUFFER = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(BUFFER)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=relay, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: forwarder.py SOCKET -- COMMAND [ARG...]\n")
        return 2
    path, command = argv[0], argv[2:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(LISTEN)
    listener.listen(128)
    threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    try:
        child = subprocess.Popen(command)
    except OSError as err:
        sys.stderr.write(f"egressd run: cannot start {command[0]}: {err.strerror}\n")
        return 127 if isinstance(err, FileNotFoundError) else 126
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    status = child.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
