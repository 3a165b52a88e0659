// A Curator 5.4 peer for dlock-zookeeper's interop tests (tests/support/curator.rs compiles and runs it).
//
//   java CuratorPeer <connect> mutex|semmutex|read|write|semaphore|latch <path> <hold ms> [tryacquire <ms>] [permits <n>] [id <id>]
//
// semmutex is InterProcessSemaphoreMutex (Curator's non-reentrant mutex, a one-lease semaphore);
// latch is a LeaderLatch with participant id <id>: it prints SEES <id> each time the leader it
// reads (getLeader) changes to another participant while it waits, and ACQUIRED once it leads.
//
// Prints WAITING before it asks for the lock, then ACQUIRED once it holds it (or TIMEOUT if a
// `tryacquire` wait ran out), then RELEASED after it let go: after <hold ms>, or earlier when a
// line arrives on stdin (or stdin closes).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String mode = args[1];
        String path = args[2];
        long holdMs = Long.parseLong(args[3]);
        long tryMs = -1;
        int permits = 1;
        String id = "";
        for (int i = 4; i + 1 < args.length; i += 2) {
            if (args[i].equals("tryacquire")) {
                tryMs = Long.parseLong(args[i + 1]);
            } else if (args[i].equals("permits")) {
                permits = Integer.parseInt(args[i + 1]);
            } else if (args[i].equals("id")) {
                id = args[i + 1];
            } else {
                throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }

        CuratorFramework client =
                CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        client.start();
        client.blockUntilConnected();

        if (mode.equals("latch")) {
            latch(client, path, id, holdMs, tryMs);
            return;
        }
        InterProcessLock lock = null;
        InterProcessSemaphoreV2 semaphore = null;
        switch (mode) {
            case "mutex":
                lock = new InterProcessMutex(client, path);
                break;
            case "semmutex":
                lock = new InterProcessSemaphoreMutex(client, path);
                break;
            case "read":
                lock = new InterProcessReadWriteLock(client, path).readLock();
                break;
            case "write":
                lock = new InterProcessReadWriteLock(client, path).writeLock();
                break;
            case "semaphore":
                semaphore = new InterProcessSemaphoreV2(client, path, permits);
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }

        System.out.println("WAITING");
        System.out.flush();
        boolean acquired;
        Lease lease = null;
        if (lock != null) {
            if (tryMs >= 0) {
                acquired = lock.acquire(tryMs, TimeUnit.MILLISECONDS);
            } else {
                lock.acquire();
                acquired = true;
            }
        } else {
            lease = tryMs >= 0 ? semaphore.acquire(tryMs, TimeUnit.MILLISECONDS) : semaphore.acquire();
            acquired = lease != null;
        }
        if (!acquired) {
            System.out.println("TIMEOUT");
            System.out.flush();
            client.close();
            return;
        }
        System.out.println("ACQUIRED");
        System.out.flush();

        awaitRelease(holdMs);

        if (lock != null) {
            lock.release();
        } else {
            lease.close();
        }
        System.out.println("RELEASED");
        System.out.flush();
        client.close();
    }

    static void latch(CuratorFramework client, String path, String id, long holdMs, long tryMs)
            throws Exception {
        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.start();
        System.out.println("WAITING");
        System.out.flush();
        long until = tryMs >= 0 ? System.currentTimeMillis() + tryMs : Long.MAX_VALUE;
        String seen = null;
        while (!latch.hasLeadership()) {
            if (System.currentTimeMillis() >= until) {
                System.out.println("TIMEOUT");
                System.out.flush();
                latch.close();
                client.close();
                return;
            }
            try {
                Participant leader = latch.getLeader();
                // Its own id is not a change to report: the latch reads itself as the
                // leader a moment before hasLeadership() turns true.
                String other = leader.getId();
                if (leader.isLeader() && !other.equals(id) && !other.equals(seen)) {
                    seen = other;
                    System.out.println("SEES " + seen);
                    System.out.flush();
                }
            } catch (Exception ignored) {
                // no participant yet
            }
            Thread.sleep(20);
        }
        System.out.println("ACQUIRED");
        System.out.flush();
        awaitRelease(holdMs);
        latch.close();
        System.out.println("RELEASED");
        System.out.flush();
        client.close();
    }

    static void awaitRelease(long holdMs) throws InterruptedException {
        CountDownLatch release = new CountDownLatch(1);
        Thread stdin = new Thread(() -> {
            try {
                new BufferedReader(new InputStreamReader(System.in)).readLine();
            } catch (Exception ignored) {
                // stdin closed: release too
            }
            release.countDown();
        });
        stdin.setDaemon(true);
        stdin.start();
        release.await(holdMs, TimeUnit.MILLISECONDS);
    }
}
