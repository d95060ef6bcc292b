package io.kafscale.probe;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/** Commands that use the producer with its default settings (idempotence on, acks=all). */
final class ProduceCommands {
    private ProduceCommands() {}

    /**
     * produce --topic T --count N [--prefix P] [--config k=v ...]: sends N records whose key is
     * "key-i", value "P-i" and header "n"="i", waits for every acknowledgement, and prints how
     * many were acknowledged per partition and the highest offset seen in each.
     */
    static int produce(Options options) throws Exception {
        String topic = options.require("topic");
        int count = Integer.parseInt(options.require("count"));
        String prefix = options.get("prefix", "value");
        Properties props = options.clientProperties();
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        List<Future<RecordMetadata>> sent = new ArrayList<>(count);
        try (Producer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < count; i++) {
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic,
                        ("key-" + i).getBytes(StandardCharsets.UTF_8),
                        (prefix + "-" + i).getBytes(StandardCharsets.UTF_8));
                record.headers().add(new RecordHeader("n",
                        Integer.toString(i).getBytes(StandardCharsets.UTF_8)));
                sent.add(producer.send(record));
            }
            producer.flush();
            Map<String, Object> acknowledged = new LinkedHashMap<>();
            Map<Integer, Long> highest = new java.util.TreeMap<>();
            Map<Integer, Integer> perPartition = new java.util.TreeMap<>();
            for (Future<RecordMetadata> future : sent) {
                RecordMetadata metadata = future.get(options.timeoutMs(), TimeUnit.MILLISECONDS);
                highest.merge(metadata.partition(), metadata.offset(), Math::max);
                perPartition.merge(metadata.partition(), 1, Integer::sum);
            }
            acknowledged.put("count", sent.size());
            acknowledged.put("perPartition", stringKeys(perPartition));
            acknowledged.put("highestOffset", stringKeys(highest));
            System.out.println(Json.object("acknowledged", acknowledged));
        }
        return 0;
    }

    private static <V> Map<String, Object> stringKeys(Map<Integer, V> map) {
        Map<String, Object> out = new LinkedHashMap<>();
        map.forEach((k, v) -> out.put(Integer.toString(k), v));
        return out;
    }
}
