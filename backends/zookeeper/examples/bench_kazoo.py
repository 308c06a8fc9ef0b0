"""kazoo's Lock as a baseline for lockline's ZooKeeper benchmark.

usage: python3 bench_kazoo.py HOSTS PATH CONTENDERS SECONDS

One Python process drives CONTENDERS kazoo clients (one thread each), each
taking and releasing a kazoo Lock on PATH with zero hold time. Prints
"grants_per_sec <rate>" for the grants made within SECONDS, and the p50 and
p99 (nearest rank, in ms) of each acquire ("acquire_ms <p50> / <p99>") and
of each handoff ("handoff_ms <p50> / <p99>": from a holder starting its
release to another contender's acquire returning), or "-" without samples.
"""
import math
import sys
import threading
import time

from kazoo.client import KazooClient


def p50_p99(samples_ns):
    if not samples_ns:
        return "-"
    ordered = sorted(samples_ns)

    def quantile(q):
        rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
        return ordered[rank - 1] / 1e6

    return "%.2f / %.2f" % (quantile(0.5), quantile(0.99))


def main():
    hosts, path = sys.argv[1], sys.argv[2]
    contenders, seconds = int(sys.argv[3]), float(sys.argv[4])
    clients = []
    for _ in range(contenders):
        zk = KazooClient(hosts=hosts, timeout=10)
        zk.start(timeout=10)
        clients.append(zk)
    stop = threading.Event()
    grants = [0] * contenders
    acquire_ns, handoff_ns = [], []
    # (releasing contender, time its release began), taken by the next grant.
    slot = [None]
    slot_lock = threading.Lock()

    def contend(i):
        lock = clients[i].Lock(path, str(i))
        while not stop.is_set():
            started = time.monotonic_ns()
            lock.acquire()
            granted = time.monotonic_ns()
            grants[i] += 1
            with slot_lock:
                released, slot[0] = slot[0], None
            if not stop.is_set():
                acquire_ns.append(granted - started)
                if released is not None and released[0] != i:
                    handoff_ns.append(granted - released[1])
            with slot_lock:
                slot[0] = (i, time.monotonic_ns())
            lock.release()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    counted = sum(grants)
    stop.set()
    for t in threads:
        t.join()
    for zk in clients:
        zk.stop()
        zk.close()
    print("grants_per_sec", counted / seconds, flush=True)
    print("acquire_ms", p50_p99(acquire_ns), flush=True)
    print("handoff_ms", p50_p99(handoff_ns), flush=True)


if __name__ == "__main__":
    main()
