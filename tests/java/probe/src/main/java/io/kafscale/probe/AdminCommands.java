package io.kafscale.probe;

import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.TopicListing;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;

/** Commands that use the Admin client. */
final class AdminCommands {
    private AdminCommands() {}

    /**
     * The kafka-clients version on the classpath: proves which jars a run used. Read from the
     * properties file the jar ships (AppInfoParser, which reads it, moved package in 4.x).
     */
    static int version(Options options) throws IOException {
        Properties info = new Properties();
        try (InputStream in = Admin.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            if (in == null) {
                throw new IOException("kafka/kafka-version.properties is not on the classpath");
            }
            info.load(in);
        }
        System.out.println(Json.object(
                "kafkaClients", info.getProperty("version"),
                "commit", info.getProperty("commitId"),
                "java", System.getProperty("java.version")));
        return 0;
    }

    static int describeCluster(Options options) throws Exception {
        try (Admin admin = Admin.create(options.clientProperties())) {
            DescribeClusterResult result = admin.describeCluster();
            List<Map<String, Object>> nodes = new ArrayList<>();
            List<Node> sorted = new ArrayList<>(await(result.nodes(), options));
            sorted.sort(Comparator.comparingInt(Node::id));
            for (Node node : sorted) {
                nodes.add(node(node));
            }
            System.out.println(Json.object(
                    "clusterId", await(result.clusterId(), options),
                    "controller", node(await(result.controller(), options)),
                    "nodes", nodes));
            closeQuietly(admin);
        }
        return 0;
    }

    static int listTopics(Options options) throws Exception {
        try (Admin admin = Admin.create(options.clientProperties())) {
            boolean internal = Boolean.parseBoolean(options.get("internal", "false"));
            List<TopicListing> listings = new ArrayList<>(
                    await(admin.listTopics(new ListTopicsOptions().listInternal(internal)).listings(), options));
            listings.sort(Comparator.comparing(TopicListing::name));
            List<Map<String, Object>> topics = new ArrayList<>();
            for (TopicListing listing : listings) {
                Map<String, Object> topic = new LinkedHashMap<>();
                topic.put("name", listing.name());
                topic.put("topicId", listing.topicId() == null ? null : listing.topicId().toString());
                topic.put("internal", listing.isInternal());
                topics.add(topic);
            }
            System.out.println(Json.object("topics", topics));
            closeQuietly(admin);
        }
        return 0;
    }

    private static Map<String, Object> node(Node node) {
        if (node == null || node.isEmpty()) {
            return null;
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("id", node.id());
        out.put("host", node.host());
        out.put("port", node.port());
        out.put("rack", node.rack());
        return out;
    }

    /** Waits a little longer than the client's own API timeout, so the client's error wins. */
    static <T> T await(KafkaFuture<T> future, Options options) throws Exception {
        return future.get(options.timeoutMs() + 5000L, TimeUnit.MILLISECONDS);
    }

    /** Bounded close, so a broker that stopped answering cannot hang the probe at exit. */
    private static void closeQuietly(Admin admin) {
        admin.close(Duration.ofSeconds(5));
    }
}
