// A real Apache Curator peer for lockline's interop tests (Debian
// libcurator-recipes-java): takes one Curator recipe on a path and holds it
// until its standard input closes.
//
// usage: java -cp CLASSPATH CuratorPeer CONNECT RECIPE PATH [ID]
//   RECIPE: mutex (InterProcessMutex), read / write (InterProcessReadWriteLock),
//           latch (LeaderLatch, participant id ID), semaphore (InterProcessSemaphoreV2, 1 lease)
// Prints "held" (or "leader") once it holds, then "released" after letting go.

import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    private static void waitForStdinToClose() throws Exception {
        byte[] buffer = new byte[256];
        while (System.in.read(buffer) >= 0) {
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], recipe = args[1], path = args[2];
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 10000, new RetryOneTime(100));
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        switch (recipe) {
            case "latch": {
                LeaderLatch latch = new LeaderLatch(client, path, args.length > 3 ? args[3] : "curator");
                latch.start();
                latch.await();
                System.out.println("leader " + latch.getLeader().getId());
                waitForStdinToClose();
                latch.close();
                break;
            }
            case "semaphore": {
                InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, 1);
                Lease lease = semaphore.acquire();
                System.out.println("held " + lease.getNodeName());
                waitForStdinToClose();
                lease.close();
                break;
            }
            default: {
                InterProcessLock lock;
                if (recipe.equals("mutex")) {
                    lock = new InterProcessMutex(client, path);
                } else if (recipe.equals("read")) {
                    lock = new InterProcessReadWriteLock(client, path).readLock();
                } else if (recipe.equals("write")) {
                    lock = new InterProcessReadWriteLock(client, path).writeLock();
                } else {
                    throw new IllegalArgumentException("unknown recipe " + recipe);
                }
                lock.acquire();
                System.out.println("held");
                waitForStdinToClose();
                lock.release();
            }
        }
        System.out.println("released");
        client.close();
    }
}
