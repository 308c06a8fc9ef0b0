// Apache Curator's InterProcessMutex (Debian libcurator-recipes-java) as the
// peer of lockline's ZooKeeper benchmarks (bench_zookeeper, profile_zookeeper),
// compiled by them with javac against Debian's jars.
//
// usage: java -cp CLASSPATH BenchCurator CONNECT PATH CONTENDERS SECONDS WARMUP
//
// One JVM drives CONTENDERS Curator clients, each its own ZooKeeper session
// and connection (session timeout 10 s, as lockline's benchmark sessions),
// each taking and releasing one InterProcessMutex on PATH with zero hold time
// in its own thread. After WARMUP seconds of that (not measured) it prints
// "window_start", measures for SECONDS, prints "window_end", then
// "grants <n>" (grants within the window), "grants_per_sec <rate>" and
// "client_cpu_ms <ms>" (this process's CPU time, user and system, over the
// window), and exits.

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class BenchCurator {
    private static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        int contenders = Integer.parseInt(args[2]);
        double seconds = Double.parseDouble(args[3]), warmup = Double.parseDouble(args[4]);
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < contenders; i++) {
            CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 10000, new RetryOneTime(100));
            client.start();
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no connection to " + connect);
            }
            clients.add(client);
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        AtomicLong grants = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework client : clients) {
            InterProcessMutex mutex = new InterProcessMutex(client, path);
            Thread thread = new Thread(() -> {
                try {
                    while (!stop.get()) {
                        mutex.acquire();
                        grants.incrementAndGet();
                        mutex.release();
                    }
                } catch (Exception e) {
                    e.printStackTrace();
                    System.exit(1);
                }
            });
            thread.start();
            threads.add(thread);
        }
        Thread.sleep((long) (warmup * 1000));
        System.out.println("window_start");
        System.out.flush();
        long grantsBefore = grants.get(), cpuBefore = cpuNanos(), started = System.nanoTime();
        Thread.sleep((long) (seconds * 1000));
        long grantsAfter = grants.get(), cpuAfter = cpuNanos(), ended = System.nanoTime();
        System.out.println("window_end");
        System.out.flush();
        stop.set(true);
        for (Thread thread : threads) {
            thread.join();
        }
        for (CuratorFramework client : clients) {
            client.close();
        }
        double elapsed = (ended - started) / 1e9;
        System.out.println("grants " + (grantsAfter - grantsBefore));
        System.out.println("grants_per_sec " + ((grantsAfter - grantsBefore) / elapsed));
        System.out.println("client_cpu_ms " + ((cpuAfter - cpuBefore) / 1e6));
        System.out.flush();
    }
}
