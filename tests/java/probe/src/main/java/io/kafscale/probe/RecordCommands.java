package io.kafscale.probe;

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Exact records in and out, for the cross-client round-trip tests (tests/harness/roundtrip.py).
 * Keys, values and header values travel as base64 (null stays null), so any bytes survive.
 */
final class RecordCommands {
    private RecordCommands() {}

    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder UNB64 = Base64.getDecoder();

    /**
     * produce-records --topic T --input FILE [--config k=v ...]: sends the records of FILE, one
     * JSON object a line: {"partition": P, "key_b64": B|null, "value_b64": B|null,
     * "headers": [[NAME, B|null], ...], "timestamp": MS|null}, in file order, waits for every
     * acknowledgement and prints {"acknowledged": [{"partition", "offset", "timestamp"}, ...]},
     * one entry per input line in the same order.
     */
    static int produceRecords(Options options) throws Exception {
        String topic = options.require("topic");
        List<ProducerRecord<byte[], byte[]>> records = new ArrayList<>();
        for (String line : Files.readAllLines(Path.of(options.require("input")), StandardCharsets.UTF_8)) {
            if (!line.isBlank()) {
                records.add(producerRecord(topic, line));
            }
        }
        Properties props = options.clientProperties();
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        try (Producer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
            for (ProducerRecord<byte[], byte[]> record : records) {
                sent.add(producer.send(record));
            }
            producer.flush();
            List<Map<String, Object>> acknowledged = new ArrayList<>(sent.size());
            for (Future<RecordMetadata> future : sent) {
                RecordMetadata metadata = future.get(options.timeoutMs(), TimeUnit.MILLISECONDS);
                Map<String, Object> ack = new LinkedHashMap<>();
                ack.put("partition", metadata.partition());
                ack.put("offset", metadata.offset());
                ack.put("timestamp", metadata.timestamp());
                acknowledged.add(ack);
            }
            System.out.println(Json.object("acknowledged", acknowledged));
            producer.close(Duration.ofSeconds(5));
        }
        return 0;
    }

    @SuppressWarnings("unchecked")
    private static ProducerRecord<byte[], byte[]> producerRecord(String topic, String line) {
        Map<String, Object> fields = (Map<String, Object>) JsonReader.parse(line);
        List<Header> headers = new ArrayList<>();
        for (Object pair : (List<Object>) fields.getOrDefault("headers", List.of())) {
            List<Object> nameValue = (List<Object>) pair;
            headers.add(new RecordHeader((String) nameValue.get(0), bytes(nameValue.get(1))));
        }
        Object partition = fields.get("partition");
        Object timestamp = fields.get("timestamp");
        return new ProducerRecord<>(topic,
                partition == null ? null : ((Long) partition).intValue(),
                (Long) timestamp,
                bytes(fields.get("key_b64")),
                bytes(fields.get("value_b64")),
                headers);
    }

    /**
     * consume (--topic T | --topics T1,T2,...) [--partitions 0,1,2] --start earliest|latest|MS
     * --count N [--timeout-ms T] [--config k=v ...]: assigns the partitions of every topic (no
     * consumer group), positions them with seekToBeginning, seekToEnd or offsetsForTimes (a
     * partition with no record at or after MS goes to its end), and prints JSON lines:
     * first {"ready": true, "positions": {TOPIC: {PARTITION: OFFSET}}} once every position is
     * fixed (records produced after that line are "new" for --start latest), then one line per
     * record {"topic", "partition", "offset", "timestamp", "timestampType", "key_b64",
     * "value_b64", "headers": [[NAME, B|null], ...]} in the order poll() returned them, until N
     * records arrived or --timeout-ms passed, then {"done": true, "consumed": N, "timedOut": B}.
     * Unlike the other commands the output is many lines, so a caller can act on "ready".
     */
    static int consume(Options options) throws Exception {
        String topicList = options.get("topics", null);
        String[] topics = (topicList != null ? topicList : options.require("topic")).split(",");
        List<TopicPartition> assigned = new ArrayList<>();
        for (String topic : topics) {
            for (String partition : options.get("partitions", "0").split(",")) {
                assigned.add(new TopicPartition(topic, Integer.parseInt(partition.trim())));
            }
        }
        String start = options.require("start");
        long count = Long.parseLong(options.require("count"));
        Properties props = options.clientProperties();
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", "false");
        // Positions come only from the seeks below; an out-of-range fetch must fail, not reset.
        props.put("auto.offset.reset", "none");
        PrintStream out = new PrintStream(
                new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16),
                false, StandardCharsets.UTF_8);
        try (Consumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(assigned);
            seek(consumer, assigned, start);
            Map<String, Map<String, Object>> positions = new LinkedHashMap<>();
            for (TopicPartition tp : assigned) {
                positions.computeIfAbsent(tp.topic(), t -> new LinkedHashMap<>())
                        .put(Integer.toString(tp.partition()), consumer.position(tp));
            }
            out.println(Json.object("ready", true, "positions", positions));
            out.flush();
            long consumed = 0;
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(options.timeoutMs());
            while (consumed < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    out.println(Json.write(record(record)));
                    consumed++;
                }
                out.flush();
            }
            out.println(Json.object("done", true, "consumed", consumed, "timedOut", consumed < count));
            out.flush();
            consumer.close(Duration.ofSeconds(5));
        }
        return 0;
    }

    private static void seek(Consumer<byte[], byte[]> consumer, List<TopicPartition> assigned, String start) {
        switch (start) {
            case "earliest" -> consumer.seekToBeginning(assigned);
            case "latest" -> consumer.seekToEnd(assigned);
            default -> {
                long timestamp = Long.parseLong(start);
                Map<TopicPartition, Long> query = new LinkedHashMap<>();
                assigned.forEach(tp -> query.put(tp, timestamp));
                List<TopicPartition> past = new ArrayList<>();
                for (Map.Entry<TopicPartition, OffsetAndTimestamp> found : consumer.offsetsForTimes(query).entrySet()) {
                    if (found.getValue() == null) {
                        past.add(found.getKey());
                    } else {
                        consumer.seek(found.getKey(), found.getValue().offset());
                    }
                }
                if (!past.isEmpty()) {
                    consumer.seekToEnd(past);
                }
            }
        }
    }

    private static Map<String, Object> record(ConsumerRecord<byte[], byte[]> record) {
        List<Object> headers = new ArrayList<>();
        for (Header header : record.headers()) {
            headers.add(java.util.Arrays.asList(header.key(), b64(header.value())));
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("topic", record.topic());
        out.put("partition", record.partition());
        out.put("offset", record.offset());
        out.put("timestamp", record.timestamp());
        out.put("timestampType", record.timestampType().name);
        out.put("key_b64", b64(record.key()));
        out.put("value_b64", b64(record.value()));
        out.put("headers", headers);
        return out;
    }

    private static byte[] bytes(Object base64) {
        return base64 == null ? null : UNB64.decode((String) base64);
    }

    private static String b64(byte[] bytes) {
        return bytes == null ? null : B64.encodeToString(bytes);
    }
}
