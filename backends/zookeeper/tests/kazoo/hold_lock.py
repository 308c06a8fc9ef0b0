"""Holds a kazoo Lock on a path until standard input closes.

usage: python3 hold_lock.py HOSTS PATH

Prints "held <node>" once the lock is acquired and "released" after it lets
go. kazoo is told Curator's "-lock-" pattern, so it also queues behind
lockline's (Curator-named) contenders.
"""
import sys

from kazoo.client import KazooClient


def main():
    hosts, path = sys.argv[1], sys.argv[2]
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=10)
    lock = zk.Lock(path, "kazoo", extra_lock_patterns=["-lock-"])
    lock.acquire()
    print("held", lock.node, flush=True)
    sys.stdin.read()
    lock.release()
    print("released", flush=True)
    zk.stop()
    zk.close()


if __name__ == "__main__":
    main()
