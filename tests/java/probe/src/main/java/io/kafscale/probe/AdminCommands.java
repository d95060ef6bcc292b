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
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.NewTopic;
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

    /** create-topic --topic NAME [--partitions N] [--replication-factor R] [--topic-config k=v,...] */
    static int createTopic(Options options) throws Exception {
        String name = options.get("topic", null);
        int partitions = Integer.parseInt(options.get("partitions", "1"));
        short replicationFactor = Short.parseShort(options.get("replication-factor", "1"));
        Map<String, String> configs = new LinkedHashMap<>();
        String configText = options.get("topic-config", "");
        for (String pair : configText.isEmpty() ? new String[0] : configText.split(",")) {
            String[] kv = pair.split("=", 2);
            configs.put(kv[0], kv[1]);
        }
        NewTopic topic = new NewTopic(name, partitions, replicationFactor).configs(configs);
        try (Admin admin = Admin.create(options.clientProperties())) {
            CreateTopicsResult result = admin.createTopics(List.of(topic));
            await(result.all(), options);
            Map<String, Object> created = new LinkedHashMap<>();
            created.put("name", name);
            created.put("topicId", await(result.topicId(name), options).toString());
            created.put("partitions", await(result.numPartitions(name), options));
            created.put("replicationFactor", await(result.replicationFactor(name), options));
            Map<String, Object> effective = new LinkedHashMap<>();
            for (ConfigEntry entry : await(result.config(name), options).entries()) {
                effective.put(entry.name(), entry.value());
            }
            created.put("configs", effective);
            System.out.println(Json.object("created", created));
            closeQuietly(admin);
        }
        return 0;
    }

    /** delete-topic --topic NAME */
    static int deleteTopic(Options options) throws Exception {
        String name = options.get("topic", null);
        try (Admin admin = Admin.create(options.clientProperties())) {
            await(admin.deleteTopics(List.of(name)).all(), options);
            System.out.println(Json.object("deleted", name));
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
