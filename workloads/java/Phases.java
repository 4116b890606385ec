import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.Arrays;

/**
 * Ground truth for Java frames (tests/runtimes/hotspot): cycles of 100 ms spend 50 % in {@link #hashPhase},
 * 30 % in {@link #sortPhase} (Arrays.sort with a lambda comparator) and 20 % in {@link #scanPhase}, for the
 * seconds given (default 10), after printing "ready". Each phase calls small helpers the JIT inlines once it
 * compiles them (the lambda and compareKeys into TimSort's loops), and one it cannot ({@link #sortKey}, too
 * big): the first cycles run interpreted, the later ones compiled. Phases are timed in the thread's CPU time
 * (checked about every millisecond of work), so their shares hold on a loaded machine, as a CPU profile sees them
 * (workloads/burn.h does the same); the run's length is wall-clock time.
 */
public final class Phases {
    static final long CYCLE_NANOS = 100_000_000L;
    static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    static long sink;

    static long cpu() {
        return THREADS.getCurrentThreadCpuTime();
    }

    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 10;
        long end = System.nanoTime() + (long) (seconds * 1e9);
        System.out.println("ready");
        System.out.flush();
        while (System.nanoTime() < end) {
            long start = cpu();
            hashPhase(start + CYCLE_NANOS / 2);
            sortPhase(start + CYCLE_NANOS / 2 + CYCLE_NANOS * 3 / 10);
            scanPhase(start + CYCLE_NANOS);
        }
        System.out.println(sink);
    }

    static void hashPhase(long until) {
        long h = sink;
        while (cpu() < until) {
            for (int i = 0; i < 1 << 18; i++) {
                h = mix(h, i);
            }
        }
        sink += h;
    }

    static long mix(long h, long v) {
        h ^= v * 0x9E3779B97F4A7C15L;
        return Long.rotateLeft(h, 27) * 5 + 0x52DCE729;
    }

    static void sortPhase(long until) {
        Integer[] data = new Integer[512];
        long seed = sink;
        do {
            for (int round = 0; round < 16; round++) {
                for (int i = 0; i < data.length; i++) {
                    seed = seed * 6364136223846793005L + 1442695040888963407L;
                    data[i] = (int) (seed >>> 33);
                }
                Arrays.sort(data, (a, b) -> compareKeys(a, b));
            }
        } while (cpu() < until);
        sink += data[0];
    }

    static int compareKeys(Integer a, Integer b) {
        return Integer.compare(sortKey(a), sortKey(b));
    }

    /** Too big for the JIT to inline (over FreqInlineSize's 325 bytes): samples in it show its callers. */
    static int sortKey(int v) {
        switch (v & 15) {
            case 0: return (v * 31) ^ (v >>> 1) ^ (v << 2) ^ 4096;
            case 1: return (v * 33) ^ (v >>> 2) ^ (v << 3) ^ 6007;
            case 2: return (v * 35) ^ (v >>> 3) ^ (v << 4) ^ 7918;
            case 3: return (v * 37) ^ (v >>> 4) ^ (v << 5) ^ 9829;
            case 4: return (v * 39) ^ (v >>> 5) ^ (v << 6) ^ 11740;
            case 5: return (v * 41) ^ (v >>> 6) ^ (v << 2) ^ 13651;
            case 6: return (v * 43) ^ (v >>> 7) ^ (v << 3) ^ 15562;
            case 7: return (v * 45) ^ (v >>> 1) ^ (v << 4) ^ 17473;
            case 8: return (v * 47) ^ (v >>> 2) ^ (v << 5) ^ 19384;
            case 9: return (v * 49) ^ (v >>> 3) ^ (v << 6) ^ 21295;
            case 10: return (v * 51) ^ (v >>> 4) ^ (v << 2) ^ 23206;
            case 11: return (v * 53) ^ (v >>> 5) ^ (v << 3) ^ 25117;
            case 12: return (v * 55) ^ (v >>> 6) ^ (v << 4) ^ 27028;
            case 13: return (v * 57) ^ (v >>> 7) ^ (v << 5) ^ 28939;
            case 14: return (v * 59) ^ (v >>> 1) ^ (v << 6) ^ 30850;
            case 15: return (v * 61) ^ (v >>> 2) ^ (v << 2) ^ 32761;
            default: return v;
        }
    }

    static void scanPhase(long until) {
        long[] values = new long[2048];
        long total = 0;
        while (cpu() < until) {
            for (int pass = 0; pass < 128; pass++) {
                for (int i = 0; i < values.length; i++) {
                    values[i] = step(values[i], i);
                    total += values[i];
                }
            }
        }
        sink += total;
    }

    static long step(long value, int i) {
        return value * 31 + i;
    }
}
