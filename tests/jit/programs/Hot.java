/** A JVM workload for JIT symbol tests: nearly all CPU time in Hot.hotMethod (never inlined, see the
 * test's -XX:CompileCommand), for the given seconds. usage: java Hot SECONDS */
public class Hot {
    static volatile long sink;

    static long hotMethod(long n) {
        long acc = 1;
        for (long i = 0; i < n; i++) {
            acc = acc * 1103515245L + 12345L;
        }
        return acc;
    }

    public static void main(String[] args) throws Exception {
        long end = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        System.out.println("started " + ProcessHandle.current().pid());
        while (System.nanoTime() < end) {
            sink = hotMethod(1_000_000);
        }
    }
}
