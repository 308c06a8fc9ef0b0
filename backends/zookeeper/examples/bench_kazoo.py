"""kazoo's Lock as a baseline for lockline's ZooKeeper benchmark.

usage: python3 bench_kazoo.py HOSTS PATH CONTENDERS SECONDS

One Python process drives CONTENDERS kazoo clients (one thread each), each
taking and releasing a kazoo Lock on PATH with zero hold time. Prints
"grants_per_sec <rate>" for the grants made within SECONDS.
"""
import sys
import threading
import time

from kazoo.client import KazooClient


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

    def contend(i):
        lock = clients[i].Lock(path, str(i))
        while not stop.is_set():
            lock.acquire()
            grants[i] += 1
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


if __name__ == "__main__":
    main()
