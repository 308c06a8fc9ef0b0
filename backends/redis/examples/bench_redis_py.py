"""redis-py's Lock as a baseline for lockline's Redis benchmark.

usage: python3 bench_redis_py.py PORT NAME CONTENDERS SECONDS

One Python process drives CONTENDERS redis-py clients (one thread each),
each taking and releasing a redis-py Lock on NAME with zero hold time; a
blocked acquire polls every 0.1 s, redis-py's default. Prints
"grants_per_sec <rate>" for the grants made within SECONDS, and
"handoffs_per_sec <rate>" for those that went to another contender than
the one before (the lock is not fair: a releasing thread often takes it
straight back). Then the p50 and p99 (nearest rank, in ms) of each
successful acquire ("acquire_ms <p50> / <p99>") and of each handoff
("handoff_ms <p50> / <p99>": from a holder starting its release to another
contender's acquire returning), or "-" without samples.
"""
import math
import sys
import threading
import time

import redis


def p50_p99(samples_ns):
    if not samples_ns:
        return "-"
    ordered = sorted(samples_ns)

    def quantile(q):
        rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
        return ordered[rank - 1] / 1e6

    return "%.2f / %.2f" % (quantile(0.5), quantile(0.99))


def main():
    port, name = int(sys.argv[1]), sys.argv[2]
    contenders, seconds = int(sys.argv[3]), float(sys.argv[4])
    clients = [redis.Redis(host="127.0.0.1", port=port) for _ in range(contenders)]
    stop = threading.Event()
    grants = [0] * contenders
    handoffs = [0]
    last = [-1]
    acquire_ns, handoff_ns = [], []
    # (releasing contender, time its release began), taken by the next grant.
    slot = [None]
    slot_lock = threading.Lock()

    def contend(i):
        lock = clients[i].lock(name, timeout=10)
        while not stop.is_set():
            started = time.monotonic_ns()
            if lock.acquire(blocking=True, blocking_timeout=1):
                granted = time.monotonic_ns()
                grants[i] += 1
                if last[0] != i:
                    if last[0] != -1:
                        handoffs[0] += 1
                    last[0] = i
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
    handed = handoffs[0]
    stop.set()
    for t in threads:
        t.join()
    print("grants_per_sec", counted / seconds, flush=True)
    print("handoffs_per_sec", handed / seconds, flush=True)
    print("acquire_ms", p50_p99(acquire_ns), flush=True)
    print("handoff_ms", p50_p99(handoff_ns), flush=True)


if __name__ == "__main__":
    main()
