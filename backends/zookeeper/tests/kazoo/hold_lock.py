"""Holds a kazoo recipe on a path until standard input closes.

usage: python3 hold_lock.py HOSTS PATH [lock|read|write|election|semaphore]

With KAZOO_DIGEST=user:password in the environment, kazoo authenticates with
ZooKeeper's digest scheme (its nodes keep kazoo's default, open ACL).

Prints "held <node>" (or "leader" for an election) once it holds and
"released" after it lets go. kazoo's locks are told Curator's patterns
("-lock-" for Lock; "__WRIT__" and "__READ__" for ReadLock/WriteLock), so they
also queue behind lockline's (Curator-named) contenders. kazoo's Election and
Semaphore take no such patterns: they cannot see lockline's contenders.
"""
import os
import sys

from kazoo.client import KazooClient


def hold(lock):
    lock.acquire()
    print("held", lock.node, flush=True)
    sys.stdin.read()
    lock.release()


def main():
    hosts, path = sys.argv[1], sys.argv[2]
    recipe = sys.argv[3] if len(sys.argv) > 3 else "lock"
    digest = os.environ.get("KAZOO_DIGEST")
    auth_data = [("digest", digest)] if digest else None
    zk = KazooClient(hosts=hosts, timeout=10, auth_data=auth_data)
    zk.start(timeout=10)
    if recipe == "lock":
        hold(zk.Lock(path, "kazoo", extra_lock_patterns=["-lock-"]))
    elif recipe == "read":
        hold(zk.ReadLock(path, "kazoo", extra_lock_patterns=["__WRIT__"]))
    elif recipe == "write":
        hold(zk.WriteLock(path, "kazoo", extra_lock_patterns=["__WRIT__", "__READ__"]))
    elif recipe == "election":
        def lead():
            print("leader", flush=True)
            sys.stdin.read()

        zk.Election(path, "kazoo").run(lead)
    elif recipe == "semaphore":
        semaphore = zk.Semaphore(path, "kazoo", max_leases=1)
        semaphore.acquire()
        print("held", semaphore.create_path, flush=True)
        sys.stdin.read()
        semaphore.release()
    else:
        raise SystemExit("unknown recipe " + recipe)
    print("released", flush=True)
    zk.stop()
    zk.close()


if __name__ == "__main__":
    main()
