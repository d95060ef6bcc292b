package io.kafscale.probe;

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A steady load for the fault tests (tests/harness/java_load.py): an idempotent acks=all producer
 * that runs while the test kills and pauses brokers, and says what was acknowledged.
 *
 * <p>{@code produce-load --topic T --partitions N [--name P] [--rate R] [--count C]
 * [--duration-ms D] [--stdin watch|ignore] [--config k=v ...]} sends records round-robin to
 * partitions 0..N-1, record i going to partition i % N with the value "P:%09d" of i (the format
 * of tests/harness/history.py's {@code value}), about R a second (default 250), and stops after C
 * records, after D ms (default 10 minutes), or when its stdin reaches end of file (unless
 * {@code --stdin ignore}), whichever comes first. Then it waits for every record in flight and
 * exits 0. It prints JSON lines, each flushed at once:
 * <ul>
 *   <li>{@code {"event":"started"}} once the producer exists;
 *   <li>{@code {"event":"ack","partition","offset","value"}} per acknowledged record, from the
 *       producer's callback: a line is printed only for a record the broker acknowledged;
 *   <li>{@code {"event":"send-failed","partition","value","error","message"}} per record the
 *       producer gave up on (delivery.timeout.ms, a fatal error);
 *   <li>{@code {"event":"done","sent","acked","failed","reason":"count"|"duration"|"stdin"}} last.
 * </ul>
 * The producer's defaults here: enable.idempotence=true, acks=all, linger.ms=5,
 * delivery.timeout.ms=120000 (long enough to outlive a broker's failover); --config overrides them.
 */
final class LoadCommands {
    private LoadCommands() {}

    static int produceLoad(Options options) throws Exception {
        String topic = options.require("topic");
        int partitions = Integer.parseInt(options.require("partitions"));
        String name = options.get("name", "java");
        double rate = Double.parseDouble(options.get("rate", "250"));
        long count = Long.parseLong(options.get("count", "-1"));
        long durationMs = Long.parseLong(options.get("duration-ms", "600000"));
        String stdin = options.get("stdin", "watch");
        if (partitions <= 0 || rate <= 0 || !List.of("watch", "ignore").contains(stdin)) {
            throw new IllegalArgumentException("need --partitions > 0, --rate > 0, --stdin watch|ignore");
        }
        PrintStream out = new PrintStream(
                new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16),
                false, StandardCharsets.UTF_8);
        Object printing = new Object();
        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        StdinWatch closed = new StdinWatch(System.in);
        if (stdin.equals("watch")) {
            closed.start();
        }
        long sent = 0;
        String reason;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(properties(options))) {
            emit(out, printing, Json.object("event", "started"));
            long start = System.nanoTime();
            long end = start + TimeUnit.MILLISECONDS.toNanos(durationMs);
            double interval = 1e9 / rate;
            while (true) {
                if (count >= 0 && sent >= count) {
                    reason = "count";
                    break;
                }
                if (closed.reached) {
                    reason = "stdin";
                    break;
                }
                long now = System.nanoTime();
                if (now >= end) {
                    reason = "duration";
                    break;
                }
                long due = start + (long) (sent * interval);
                if (due > now) {
                    TimeUnit.NANOSECONDS.sleep(Math.min(due - now, TimeUnit.MILLISECONDS.toNanos(50)));
                    continue;
                }
                int partition = (int) (sent % partitions);
                String value = String.format("%s:%09d", name, sent);
                producer.send(new ProducerRecord<>(topic, partition, null, value), (metadata, error) -> {
                    if (error == null) {
                        acked.incrementAndGet();
                        emit(out, printing, Json.object("event", "ack", "partition", metadata.partition(),
                                "offset", metadata.offset(), "value", value));
                    } else {
                        failed.incrementAndGet();
                        emit(out, printing, Json.object("event", "send-failed", "partition", partition,
                                "value", value, "error", error.getClass().getName(),
                                "message", error.getMessage()));
                    }
                });
                sent++;
            }
            producer.flush(); // every record in flight is acknowledged or failed (callbacks ran)
            producer.close(Duration.ofSeconds(10));
        }
        emit(out, printing, Json.object("event", "done", "sent", sent, "acked", acked.get(),
                "failed", failed.get(), "reason", reason));
        return 0;
    }

    private static Properties properties(Options options) {
        Properties props = new Properties();
        props.put("enable.idempotence", "true");
        props.put("acks", "all");
        props.put("linger.ms", "5");
        props.put("delivery.timeout.ms", "120000");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        props.putAll(options.clientProperties()); // bootstrap, client.id, timeouts, every --config
        return props;
    }

    private static void emit(PrintStream out, Object lock, String line) {
        synchronized (lock) {
            out.println(line);
            out.flush();
        }
    }

    /** Reads stdin to its end (the test closed the pipe, or died), then sets {@code reached}. */
    private static final class StdinWatch extends Thread {
        private final InputStream in;
        volatile boolean reached;

        StdinWatch(InputStream in) {
            super("produce-load-stdin");
            setDaemon(true);
            this.in = in;
        }

        @Override
        public void run() {
            byte[] buffer = new byte[256];
            try {
                while (in.read(buffer) >= 0) {
                    // Anything written is ignored: only the end matters.
                }
            } catch (IOException e) {
                // A broken stdin is an end too.
            }
            reached = true;
        }
    }
}
