// The benchmark workloads W1-W4 of `dlock bench` run through Apache Curator's InterProcessMutex,
// and W1S through its InterProcessSemaphoreV2, for comparison with dlock's zk:// backend in the same run. `dlock bench` (crates/dlock-cli,
// src/bench/curator.rs) compiles this file with javac against Debian's Curator jars and runs it.
//
//   java CuratorBench <connect string[/chroot]> <base path> <cycles> <limit ms (0: none)> W1,W1S,W2,W3,W4
//
// Like dlock bench: W1 is one client's acquire+release cycles on one mutex after a warm-up, W1S
// the same with one lease of a semaphore of 4 (acquire + returnLease), W2
// 8 clients (8 sessions) on one mutex (cycles * 2 in all), W3 two clients passing one mutex back
// and forth (cycles / 4 handoffs; a handoff is from the holder's release call to the waiter's
// acquire returning), W4 8 clients each on its own mutex. Prints one JSON line:
//
//   {"W1":{"cycles":N,"seconds":S,"p50_us":..,"p99_us":..,"p999_us":..,"violations":0},...}
//
// Latencies are per cycle (W1), per acquire wait (W2, W4) and per handoff (W3).

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorBench {
    /** Warm-up cycles before W1: enough for the JIT to compile Curator's hot path. */
    static final int WARM_UP = 1000;
    static final int CLIENTS = 8;

    static String connect;
    static long limitNanos;

    static CuratorFramework client() throws InterruptedException {
        CuratorFramework c =
                CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryNTimes(3, 100));
        c.start();
        if (!c.blockUntilConnected(20, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        return c;
    }

    static boolean outOfTime(long started) {
        return limitNanos > 0 && System.nanoTime() - started >= limitNanos;
    }

    /** Latencies in nanoseconds -> a JSON object with the workload's results. */
    static String result(long cycles, long elapsedNanos, long[] lat, int n, long violations) {
        long[] sorted = Arrays.copyOf(lat, n);
        Arrays.sort(sorted);
        return String.format(
                "{\"cycles\":%d,\"seconds\":%.6f,\"p50_us\":%d,\"p99_us\":%d,\"p999_us\":%d,\"violations\":%d}",
                cycles,
                elapsedNanos / 1e9,
                quantile(sorted, 0.5),
                quantile(sorted, 0.99),
                quantile(sorted, 0.999),
                violations);
    }

    static long quantile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return 0;
        }
        int i = (int) Math.ceil(q * sorted.length) - 1;
        return Math.max(1, sorted[Math.max(0, Math.min(sorted.length - 1, i))] / 1000);
    }

    static String w1(String base, long cycles) throws Exception {
        CuratorFramework c = client();
        try {
            InterProcessMutex m = new InterProcessMutex(c, base + "/w1");
            for (int i = 0; i < WARM_UP; i++) {
                m.acquire();
                m.release();
            }
            long[] lat = new long[(int) cycles];
            long started = System.nanoTime();
            int n = 0;
            while (n < cycles && !outOfTime(started)) {
                long t = System.nanoTime();
                m.acquire();
                m.release();
                lat[n++] = System.nanoTime() - t;
            }
            return result(n, System.nanoTime() - started, lat, n, 0);
        } finally {
            c.close();
        }
    }

    /** W1S: W1 with one lease of a semaphore of 4 (dlock's W1S_PERMITS). */
    static String w1s(String base, long cycles) throws Exception {
        CuratorFramework c = client();
        try {
            InterProcessSemaphoreV2 s = new InterProcessSemaphoreV2(c, base + "/w1s", 4);
            for (int i = 0; i < WARM_UP; i++) {
                s.returnLease(s.acquire());
            }
            long[] lat = new long[(int) cycles];
            long started = System.nanoTime();
            int n = 0;
            while (n < cycles && !outOfTime(started)) {
                long t = System.nanoTime();
                Lease lease = s.acquire();
                s.returnLease(lease);
                lat[n++] = System.nanoTime() - t;
            }
            return result(n, System.nanoTime() - started, lat, n, 0);
        } finally {
            c.close();
        }
    }

    /** W2 (shared = true) and W4: 8 clients, each with its own session and thread. */
    static String many(String base, long cycles, boolean shared) throws Exception {
        long per = cycles * 2 / CLIENTS;
        List<CuratorFramework> clients = new ArrayList<>();
        ExecutorService pool = Executors.newFixedThreadPool(CLIENTS);
        AtomicLong inside = new AtomicLong();
        AtomicLong overlaps = new AtomicLong();
        AtomicLong counter = new AtomicLong();
        try {
            for (int i = 0; i < CLIENTS; i++) {
                clients.add(client());
            }
            long started = System.nanoTime();
            List<Future<long[]>> results = new ArrayList<>();
            for (int i = 0; i < CLIENTS; i++) {
                String path = shared ? base + "/w2" : base + "/w4/" + i;
                InterProcessMutex m = new InterProcessMutex(clients.get(i), path);
                results.add(pool.submit(() -> {
                    long[] lat = new long[(int) per + 1];
                    int n = 0;
                    while (n < per && !outOfTime(started)) {
                        long t = System.nanoTime();
                        m.acquire();
                        lat[n + 1] = System.nanoTime() - t;
                        if (inside.getAndIncrement() > 0) {
                            overlaps.incrementAndGet();
                        }
                        long seen = counter.get();
                        Thread.yield();
                        counter.set(seen + 1);
                        inside.decrementAndGet();
                        m.release();
                        n++;
                    }
                    lat[0] = n;
                    return lat;
                }));
            }
            long[] all = new long[(int) (per * CLIENTS)];
            int n = 0;
            for (Future<long[]> f : results) {
                long[] lat = f.get();
                int k = (int) lat[0];
                System.arraycopy(lat, 1, all, n, k);
                n += k;
            }
            long elapsed = System.nanoTime() - started;
            long violations = shared ? overlaps.get() + Math.max(0, n - counter.get()) : 0;
            return result(n, elapsed, all, n, violations);
        } finally {
            pool.shutdownNow();
            for (CuratorFramework c : clients) {
                c.close();
            }
        }
    }

    /**
     * W3: two clients (two sessions) pass one mutex back and forth. InterProcessMutex belongs
     * to the thread that acquired it, so each client acquires and releases on its own thread.
     */
    static String w3(String base, long cycles) throws Exception {
        long handoffs = Math.max(2, cycles / 4);
        CuratorFramework ca = client();
        CuratorFramework cb = client();
        ExecutorService ta = Executors.newSingleThreadExecutor();
        ExecutorService tb = Executors.newSingleThreadExecutor();
        try {
            InterProcessMutex a = new InterProcessMutex(ca, base + "/w3");
            InterProcessMutex b = new InterProcessMutex(cb, base + "/w3");
            // Warm both threads up a little (a few uncontended cycles each).
            for (int i = 0; i < 50; i++) {
                ta.submit(() -> { a.acquire(); a.release(); return null; }).get();
                tb.submit(() -> { b.acquire(); b.release(); return null; }).get();
            }
            ta.submit(() -> { a.acquire(); return null; }).get();
            boolean holderIsA = true;
            long[] lat = new long[(int) handoffs];
            long started = System.nanoTime();
            int n = 0;
            while (n < handoffs && !outOfTime(started)) {
                InterProcessMutex holder = holderIsA ? a : b;
                InterProcessMutex waiter = holderIsA ? b : a;
                ExecutorService holderThread = holderIsA ? ta : tb;
                ExecutorService waiterThread = holderIsA ? tb : ta;
                Future<Long> acquired = waiterThread.submit(() -> {
                    waiter.acquire();
                    return System.nanoTime();
                });
                // Let the waiter reach the server before the release (as dlock bench does).
                Thread.sleep(2);
                // From the release's call: the waiter's grant can come before the release
                // returns, never before it is called.
                long releasing = holderThread.submit(() -> {
                    long called = System.nanoTime();
                    holder.release();
                    return called;
                }).get();
                lat[n++] = acquired.get() - releasing;
                holderIsA = !holderIsA;
            }
            long elapsed = System.nanoTime() - started;
            InterProcessMutex last = holderIsA ? a : b;
            (holderIsA ? ta : tb).submit(() -> { last.release(); return null; }).get();
            return result(n, elapsed, lat, n, 0);
        } finally {
            ta.shutdownNow();
            tb.shutdownNow();
            ca.close();
            cb.close();
        }
    }

    public static void main(String[] args) throws Exception {
        connect = args[0];
        String base = args[1];
        long cycles = Long.parseLong(args[2]);
        limitNanos = Long.parseLong(args[3]) * 1_000_000L;
        StringBuilder out = new StringBuilder("{");
        for (String w : args[4].split(",")) {
            String r;
            switch (w) {
                case "W1":
                    r = w1(base, cycles);
                    break;
                case "W1S":
                    r = w1s(base, cycles);
                    break;
                case "W2":
                    r = many(base, cycles, true);
                    break;
                case "W3":
                    r = w3(base, cycles);
                    break;
                case "W4":
                    r = many(base, cycles, false);
                    break;
                default:
                    continue;
            }
            if (out.length() > 1) {
                out.append(',');
            }
            out.append('"').append(w).append("\":").append(r);
        }
        System.out.println(out.append('}'));
        System.out.flush();
        System.exit(0);
    }
}
