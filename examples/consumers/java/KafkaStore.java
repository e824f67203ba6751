import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads a topic kube-event-bridge writes, from its start to where it ended when reading began,
 * with read_committed, applies every event (binary mode: attributes in ce_* headers) to a
 * {@link Store}, and prints the objects held as JSON: {"objects": {uid: resourceVersion}, ...}.
 *
 * <pre>java -cp .:kafka-clients.jar:... KafkaStore BOOTSTRAP_SERVERS TOPIC [--by-name]</pre>
 */
public final class KafkaStore {
    public static void main(String[] args) {
        String bootstrap = args[0];
        String topic = args[1];
        boolean byName = args.length > 2 && args[2].equals("--by-name");
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "keb-java-" + UUID.randomUUID());
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        Store store = new Store();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = consumer.partitionsFor(topic, Duration.ofSeconds(30)).stream()
                .map(p -> new TopicPartition(topic, p.partition()))
                .toList();
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            // Where each partition ends now (read_committed: the last stable offset).
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            Set<TopicPartition> pending = new HashSet<>();
            ends.forEach((p, end) -> { if (end > 0) pending.add(p); });
            long quietSince = System.nanoTime();
            while (!pending.isEmpty()) {
                var records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    if (r.value() == null) {
                        store.tombstone(new String(r.key(), StandardCharsets.UTF_8), byName);
                    } else {
                        store.apply(attributes(r));
                    }
                }
                // Transaction markers occupy offsets: the position, not the last record, tells.
                pending.removeIf(p -> consumer.position(p) >= ends.get(p));
                if (!records.isEmpty()) {
                    quietSince = System.nanoTime();
                } else if (System.nanoTime() - quietSince > Duration.ofSeconds(10).toNanos()) {
                    System.err.println("no record for 10 s with " + pending + " not read to their end");
                    System.exit(1);
                }
            }
        }
        StringBuilder json = new StringBuilder("{\"objects\": {");
        String sep = "";
        for (var e : store.snapshot().entrySet()) {
            json.append(sep).append(quote(e.getKey())).append(": ").append(quote(e.getValue()));
            sep = ", ";
        }
        json.append("}, \"applied\": ").append(store.applied).append(", \"dropped\": ").append(store.dropped).append("}");
        System.out.println(json);
    }

    /** The event's attributes: the ce_* headers (plain UTF-8), without the prefix. */
    static Map<String, String> attributes(ConsumerRecord<byte[], byte[]> r) {
        Map<String, String> out = new HashMap<>();
        for (Header h : r.headers()) {
            if (h.key().startsWith("ce_") && h.value() != null) {
                out.put(h.key().substring(3), new String(h.value(), StandardCharsets.UTF_8));
            }
        }
        return out;
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }
}
