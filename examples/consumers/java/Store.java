import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * The current objects, built from kube-event-bridge's events by the rules of docs/consumers.md
 * ("The rules for a consumer in any language"): keyed by uid; per uid the sequence of the last
 * applied event (string order is numeric order); deletes never dropped for their sequence,
 * deleted uids remembered; a name held by the object with the higher sequence; a tombstone
 * removes what its record key names.
 */
final class Store {
    record Entry(String uid, String namespace, String name, String resourceVersion, String sequence) {}

    private final Map<String, Entry> objects = new HashMap<>();
    private final Map<String, String> names = new HashMap<>();
    private final Set<String> deleted = new HashSet<>();
    int applied;
    int dropped;

    /** Applies one event given its attributes; returns whether the store changed. */
    boolean apply(Map<String, String> a) {
        String type = a.getOrDefault("type", "");
        if (!type.startsWith("io.kubeeventbridge.object.")) {
            dropped++;
            return false;
        }
        String uid = a.get("uid");
        String sequence = a.get("sequence");
        if (deleted.contains(uid)) {
            dropped++;
            return false;
        }
        if (type.endsWith(".deleted")) {
            remove(uid);
            deleted.add(uid);
            applied++;
            return true;
        }
        Entry held = objects.get(uid);
        if (held != null && sequence.compareTo(held.sequence()) <= 0) {
            dropped++;
            return false;
        }
        String namespace = a.getOrDefault("namespace", "");
        String key = namespace + "/" + a.get("name");
        String other = names.get(key);
        if (other != null && !other.equals(uid)) {
            if (objects.get(other).sequence().compareTo(sequence) > 0) {
                deleted.add(uid);
                dropped++;
                return false;
            }
            remove(other);
            deleted.add(other);
        }
        objects.put(uid, new Entry(uid, namespace, a.get("name"), a.get("resourceversion"), sequence));
        names.put(key, uid);
        applied++;
        return true;
    }

    /** A null-valued record: removes the object its key names (namespace/name, or the uid). */
    void tombstone(String key, boolean byName) {
        String uid = byName ? names.get(key.contains("/") ? key : "/" + key) : key;
        if (uid != null && objects.containsKey(uid)) {
            remove(uid);
            deleted.add(uid);
        }
    }

    private void remove(String uid) {
        Entry e = objects.remove(uid);
        if (e != null) {
            names.remove(e.namespace() + "/" + e.name(), uid);
        }
    }

    /** uid to resourceVersion of every object held, sorted by uid. */
    Map<String, String> snapshot() {
        Map<String, String> out = new TreeMap<>();
        objects.forEach((uid, e) -> out.put(uid, e.resourceVersion()));
        return out;
    }
}
