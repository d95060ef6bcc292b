package io.kafscale.probe;

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.clients.consumer.StickyAssignor;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A consumer-group member for the group tests (tests/harness/groups.py), run as a process that a
 * test starts several of, reads while they run, and stops with SIGTERM or kills with SIGKILL.
 *
 * <p>{@code group-consume (--topic T | --topics T1,T2) --group G [--count N] [--timeout-ms T]
 * [--assignor range|roundrobin|sticky|cooperative-sticky] [--instance-id ID]
 * [--commit after-processing|auto|none] [--auto-offset-reset earliest|latest|none]
 * [--exit-after-assigned-ms X] [--poll-ms P] [--config k=v ...]} subscribes (the group assigns
 * the partitions) and prints JSON lines, each flushed before the next step, so what a killed
 * member printed is exactly what it did:
 * <ul>
 *   <li>{@code {"event":"started","group":G,"topics":[..]}} once subscribed;
 *   <li>{@code {"event":"assigned"|"revoked"|"lost","partitions":[{"topic","partition"}..],
 *       "memberId","generationId"}} from the rebalance listener (with the cooperative assignor
 *       these are the partitions added or taken away, not the whole assignment; an empty
 *       "revoked" or "lost" is not printed, an empty "assigned" is: a rebalance finished);
 *   <li>{@code {"event":"record","topic","partition","offset","key","value"}} per record (key and
 *       value as UTF-8 text, null stays null), printed before its offset is committed;
 *   <li>{@code {"event":"committed","offsets":[{"topic","partition","offset"}..]}} after a
 *       synchronous commit succeeded (offset: the next one to consume), with
 *       {@code --commit after-processing} after each poll's records and for revoked partitions;
 *       {@code {"event":"commit-failed","error","message"}} if one failed (it goes on: a later
 *       owner re-reads those records, as in any application);
 *   <li>{@code {"event":"error","error","message"}} before exiting 1 on any other failure;
 *   <li>{@code {"event":"done","consumed":N,"reason":"count"|"timeout"|"signal"|"assigned-time",
 *       "everAssigned":B}} last, after the consumer closed (which leaves the group, unless it is a
 *       static member).
 * </ul>
 * It stops after N records (no --count: no limit), at --timeout-ms (the whole run, default 20 s),
 * X ms after its first non-empty assignment, or on SIGTERM; each of these exits 0. The client's
 * own timeouts (request.timeout.ms, default.api.timeout.ms) stay at their defaults unless set
 * with --config.
 */
final class GroupCommands {
    private GroupCommands() {}

    private static final Map<String, String> ASSIGNORS = Map.of(
            "range", RangeAssignor.class.getName(),
            "roundrobin", RoundRobinAssignor.class.getName(),
            "sticky", StickyAssignor.class.getName(),
            "cooperative-sticky", CooperativeStickyAssignor.class.getName());

    static int groupConsume(Options options) throws Exception {
        Member member = new Member(options);
        // SIGTERM: wake the poll loop and wait (bounded) until it closed the consumer and printed
        // "done", then end the JVM with the loop's exit code. The hook must halt, not return:
        // the main thread calling System.exit while hooks run would block forever.
        Thread hook = new Thread(() -> {
            member.stopRequested = true;
            try {
                member.consumer.wakeup();
            } catch (RuntimeException e) {
                // Already closed: the loop is done.
            }
            try {
                member.finished.await(20, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            member.out.flush();
            Runtime.getRuntime().halt(member.exitCode);
        }, "group-consume-sigterm");
        Runtime.getRuntime().addShutdownHook(hook);
        try {
            member.exitCode = member.run();
        } finally {
            member.finished.countDown();
            try {
                Runtime.getRuntime().removeShutdownHook(hook);
            } catch (IllegalStateException e) {
                // A SIGTERM arrived meanwhile: its hook ends the JVM with member.exitCode.
            }
        }
        return member.exitCode;
    }

    /** One run of group-consume: the consumer, what it processed, and how it ends. */
    private static final class Member implements ConsumerRebalanceListener {
        final PrintStream out = new PrintStream(
                new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16),
                false, StandardCharsets.UTF_8);
        final CountDownLatch finished = new CountDownLatch(1);
        volatile boolean stopRequested;
        volatile int exitCode = 1;

        final KafkaConsumer<String, String> consumer;
        private final Options options;
        private final List<String> topics;
        private final String commit;
        private final long count;
        private final long deadline;
        private final long exitAfterAssignedMs;
        /** Offsets processed (printed) but not yet committed: next offset per partition. */
        private final Map<TopicPartition, OffsetAndMetadata> pending = new LinkedHashMap<>();
        private long consumed;
        private boolean everAssigned;
        private long stopAt = Long.MAX_VALUE;

        Member(Options options) {
            this.options = options;
            String topicList = options.get("topics", null);
            topics = Arrays.asList((topicList != null ? topicList : options.require("topic")).split(","));
            commit = options.get("commit", "after-processing");
            if (!List.of("after-processing", "auto", "none").contains(commit)) {
                throw new IllegalArgumentException("--commit must be after-processing, auto or none");
            }
            count = Long.parseLong(options.get("count", "-1"));
            deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(options.timeoutMs());
            exitAfterAssignedMs = Long.parseLong(options.get("exit-after-assigned-ms", "-1"));
            consumer = new KafkaConsumer<>(properties());
        }

        private Properties properties() {
            Properties props = new Properties();
            props.put("group.id", options.require("group"));
            props.put("key.deserializer", StringDeserializer.class.getName());
            props.put("value.deserializer", StringDeserializer.class.getName());
            props.put("enable.auto.commit", Boolean.toString(commit.equals("auto")));
            props.put("auto.offset.reset", options.get("auto-offset-reset", "earliest"));
            String assignor = options.get("assignor", null);
            if (assignor != null) {
                String name = ASSIGNORS.get(assignor);
                if (name == null) {
                    throw new IllegalArgumentException("--assignor must be one of " + ASSIGNORS.keySet());
                }
                props.put("partition.assignment.strategy", name);
            }
            String instanceId = options.get("instance-id", null);
            if (instanceId != null) {
                props.put("group.instance.id", instanceId);
            }
            // Then bootstrap, client.id and every --config (which may override the above).
            // Options.clientProperties() also sets the client's API timeouts to --timeout-ms,
            // which here bounds the whole run: those two keep the client's defaults unless a
            // --config gave them another value.
            Properties given = options.clientProperties();
            String runTimeout = Integer.toString(options.timeoutMs());
            for (String key : List.of("request.timeout.ms", "default.api.timeout.ms")) {
                if (runTimeout.equals(given.get(key))) {
                    given.remove(key);
                }
            }
            props.putAll(given);
            return props;
        }

        int run() throws Exception {
            String reason;
            try {
                consumer.subscribe(topics, this);
                emit(Json.object("event", "started", "group", options.require("group"), "topics", topics));
                reason = pollLoop();
            } catch (WakeupException e) {
                reason = "signal";
            } catch (Exception e) {
                emit(Json.object("event", "error", "error", e.getClass().getName(), "message", e.getMessage()));
                closeQuietly();
                throw e;
            }
            if (commit.equals("after-processing")) {
                try {
                    commitPending(null);
                } catch (WakeupException e) {
                    commitPending(null); // the SIGTERM's wakeup was still pending: it is spent now
                }
            }
            closeQuietly();
            emit(Json.object("event", "done", "consumed", consumed, "reason", reason, "everAssigned", everAssigned));
            return 0;
        }

        private String pollLoop() {
            Duration pollTimeout = Duration.ofMillis(Long.parseLong(options.get("poll-ms", "200")));
            while (true) {
                if (stopRequested) {
                    return "signal";
                }
                if (count >= 0 && consumed >= count) {
                    return "count";
                }
                if (System.nanoTime() >= stopAt) {
                    return "assigned-time";
                }
                if (System.nanoTime() >= deadline) {
                    return "timeout";
                }
                ConsumerRecords<String, String> records = consumer.poll(pollTimeout);
                for (ConsumerRecord<String, String> record : records) {
                    if (count >= 0 && consumed >= count) {
                        break; // the rest is left for the next owner: it is not committed
                    }
                    out.println(Json.write(record(record)));
                    pending.put(new TopicPartition(record.topic(), record.partition()),
                            new OffsetAndMetadata(record.offset() + 1));
                    consumed++;
                }
                out.flush();
                if (commit.equals("after-processing")) {
                    commitPending(null);
                } else {
                    pending.clear();
                }
            }
        }

        /** Commits what was processed (only in `partitions`, if given), synchronously. */
        private void commitPending(Collection<TopicPartition> partitions) {
            Map<TopicPartition, OffsetAndMetadata> offsets = new LinkedHashMap<>();
            pending.forEach((tp, offset) -> {
                if (partitions == null || partitions.contains(tp)) {
                    offsets.put(tp, offset);
                }
            });
            if (offsets.isEmpty()) {
                return;
            }
            try {
                consumer.commitSync(offsets);
            } catch (WakeupException e) {
                throw e;
            } catch (Exception e) {
                // CommitFailedException, RebalanceInProgressException, a timeout: the next owner
                // of these partitions reads the records again (at-least-once).
                offsets.keySet().forEach(pending::remove);
                emit(Json.object("event", "commit-failed", "error", e.getClass().getName(), "message", e.getMessage(),
                        "offsets", offsets(offsets)));
                return;
            }
            offsets.keySet().forEach(pending::remove);
            emit(Json.object("event", "committed", "offsets", offsets(offsets)));
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            if (commit.equals("after-processing")) {
                commitPending(partitions);
            }
            partitions.forEach(pending::remove);
            if (!partitions.isEmpty()) {
                emit(rebalance("revoked", partitions));
            }
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            if (!partitions.isEmpty() && !everAssigned) {
                everAssigned = true;
                if (exitAfterAssignedMs >= 0) {
                    stopAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(exitAfterAssignedMs);
                }
            }
            emit(rebalance("assigned", partitions));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            // Another member may own them already: committing would be wrong, so nothing is.
            partitions.forEach(pending::remove);
            if (!partitions.isEmpty()) {
                emit(rebalance("lost", partitions));
            }
        }

        private String rebalance(String event, Collection<TopicPartition> partitions) {
            List<TopicPartition> sorted = new ArrayList<>(partitions);
            sorted.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
            List<Map<String, Object>> list = new ArrayList<>();
            for (TopicPartition tp : sorted) {
                Map<String, Object> entry = new LinkedHashMap<>();
                entry.put("topic", tp.topic());
                entry.put("partition", tp.partition());
                list.add(entry);
            }
            String memberId = null;
            Integer generationId = null;
            try {
                ConsumerGroupMetadata metadata = consumer.groupMetadata();
                memberId = metadata.memberId();
                generationId = metadata.generationId();
            } catch (RuntimeException e) {
                // Not available while the consumer closes on some versions: leave them null.
            }
            return Json.object("event", event, "partitions", list,
                    "memberId", memberId, "generationId", generationId);
        }

        private void emit(String line) {
            out.println(line);
            out.flush();
        }

        /** Bounded close (leaves the group), so a broker that stopped answering cannot hang it. */
        private void closeQuietly() {
            try {
                consumer.close(Duration.ofSeconds(5));
            } catch (Exception e) {
                emit(Json.object("event", "close-failed", "error", e.getClass().getName(), "message", e.getMessage()));
            }
        }
    }

    private static List<Map<String, Object>> offsets(Map<TopicPartition, OffsetAndMetadata> offsets) {
        List<Map<String, Object>> list = new ArrayList<>();
        offsets.forEach((tp, offset) -> {
            Map<String, Object> entry = new LinkedHashMap<>();
            entry.put("topic", tp.topic());
            entry.put("partition", tp.partition());
            entry.put("offset", offset.offset());
            list.add(entry);
        });
        return list;
    }

    private static Map<String, Object> record(ConsumerRecord<String, String> record) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("event", "record");
        out.put("topic", record.topic());
        out.put("partition", record.partition());
        out.put("offset", record.offset());
        out.put("key", record.key());
        out.put("value", record.value());
        return out;
    }
}
