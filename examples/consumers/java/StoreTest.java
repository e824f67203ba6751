import java.util.Map;

/** The store's rules, without a broker: `java StoreTest` exits non-zero on a failure. */
public final class StoreTest {
    static Map<String, String> event(String change, String uid, int rv, String name) {
        return Map.of("type", "io.kubeeventbridge.object." + change, "uid", uid,
            "resourceversion", Integer.toString(rv), "sequence", String.format("%020d", rv),
            "name", name, "namespace", "ns");
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            System.err.println("FAILED: " + what);
            System.exit(1);
        }
    }

    public static void main(String[] args) {
        Store s = new Store();
        s.apply(event("added", "u1", 5, "a"));
        s.apply(event("modified", "u1", 9, "a"));
        check(!s.apply(event("modified", "u1", 9, "a")), "a duplicate is dropped");
        check(!s.apply(event("modified", "u1", 7, "a")), "a stale version is dropped");
        check(s.apply(event("deleted", "u1", 5, "a")), "a repaired delete with an older version applies");
        check(!s.apply(event("modified", "u1", 12, "a")), "a deleted uid stays deleted");
        s.apply(event("added", "old", 20, "b"));
        s.apply(event("added", "new", 30, "b"));
        check(!s.apply(event("modified", "old", 25, "b")), "the replaced uid does not come back");
        check(s.snapshot().equals(Map.of("new", "30")), "the newer uid holds the name: " + s.snapshot());
        s.tombstone("ns/b", true);
        check(s.snapshot().isEmpty(), "a tombstone removes what its key names");
        System.out.println("StoreTest: OK");
    }
}
