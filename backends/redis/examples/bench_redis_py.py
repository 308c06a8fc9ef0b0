"""redis-py's Lock as a baseline for lockline's Redis benchmark.

usage: python3 bench_redis_py.py PORT NAME CONTENDERS SECONDS

One Python process drives CONTENDERS redis-py clients (one thread each),
each taking and releasing a redis-py Lock on NAME with zero hold time; a
blocked acquire polls every 0.1 s, redis-py's default. Prints
"grants_per_sec <rate>" for the grants made within SECONDS, and
"handoffs_per_sec <rate>" for those that went to another contender than
the one before (the lock is not fair: a releasing thread often takes it
straight back).
"""
import sys
import threading
import time

import redis


def main():
    port, name = int(sys.argv[1]), sys.argv[2]
    contenders, seconds = int(sys.argv[3]), float(sys.argv[4])
    clients = [redis.Redis(host="127.0.0.1", port=port) for _ in range(contenders)]
    stop = threading.Event()
    grants = [0] * contenders
    handoffs = [0]
    last = [-1]

    def contend(i):
        lock = clients[i].lock(name, timeout=10)
        while not stop.is_set():
            if lock.acquire(blocking=True, blocking_timeout=1):
                grants[i] += 1
                if last[0] != i:
                    if last[0] != -1:
                        handoffs[0] += 1
                    last[0] = i
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


if __name__ == "__main__":
    main()
