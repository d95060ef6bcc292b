package io.kafscale.probe;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterConfigsOptions;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.common.config.ConfigResource;

/** Commands that describe and alter configs, and add partitions, with the Admin client. */
final class ConfigCommands {
    private ConfigCommands() {}

    /**
     * describe-configs (--topic NAME | --broker ID): every config of the resource, with synonyms
     * and documentation, as {"configs": {NAME: {"value", "source", "readOnly", "sensitive",
     * "type", "documentation", "synonyms": [{"name", "value", "source"}]}}}.
     */
    static int describeConfigs(Options options) throws Exception {
        ConfigResource resource = resource(options);
        DescribeConfigsOptions describe =
                new DescribeConfigsOptions().includeSynonyms(true).includeDocumentation(true);
        try (Admin admin = Admin.create(options.clientProperties())) {
            Config config = AdminCommands.await(
                    admin.describeConfigs(List.of(resource), describe).values().get(resource),
                    options);
            Map<String, Object> configs = new TreeMap<>();
            for (ConfigEntry entry : config.entries()) {
                Map<String, Object> described = new LinkedHashMap<>();
                described.put("value", entry.value());
                described.put("source", entry.source().name());
                described.put("readOnly", entry.isReadOnly());
                described.put("sensitive", entry.isSensitive());
                described.put("type", entry.type().name());
                described.put("documentation", entry.documentation());
                List<Map<String, Object>> synonyms = new ArrayList<>();
                for (ConfigEntry.ConfigSynonym synonym : entry.synonyms()) {
                    Map<String, Object> s = new LinkedHashMap<>();
                    s.put("name", synonym.name());
                    s.put("value", synonym.value());
                    s.put("source", synonym.source().name());
                    synonyms.add(s);
                }
                described.put("synonyms", synonyms);
                configs.put(entry.name(), described);
            }
            System.out.println(Json.object("configs", configs));
            admin.close(Duration.ofSeconds(5));
        }
        return 0;
    }

    /**
     * alter-configs (--topic NAME | --broker ID) [--set k=v,...] [--delete k,...]
     * [--append k=v,...] [--subtract k=v,...] [--validate-only true]: one
     * incrementalAlterConfigs call; prints {"altered": NAME}. (Values cannot hold commas.)
     */
    static int alterConfigs(Options options) throws Exception {
        ConfigResource resource = resource(options);
        List<AlterConfigOp> ops = new ArrayList<>();
        for (String[] kv : pairs(options.get("set", ""))) {
            ops.add(new AlterConfigOp(new ConfigEntry(kv[0], kv[1]), AlterConfigOp.OpType.SET));
        }
        for (String name : items(options.get("delete", ""))) {
            ops.add(new AlterConfigOp(new ConfigEntry(name, null), AlterConfigOp.OpType.DELETE));
        }
        for (String[] kv : pairs(options.get("append", ""))) {
            ops.add(new AlterConfigOp(new ConfigEntry(kv[0], kv[1]), AlterConfigOp.OpType.APPEND));
        }
        for (String[] kv : pairs(options.get("subtract", ""))) {
            ops.add(new AlterConfigOp(new ConfigEntry(kv[0], kv[1]), AlterConfigOp.OpType.SUBTRACT));
        }
        AlterConfigsOptions alter = new AlterConfigsOptions()
                .validateOnly(Boolean.parseBoolean(options.get("validate-only", "false")));
        try (Admin admin = Admin.create(options.clientProperties())) {
            Map<ConfigResource, Collection<AlterConfigOp>> changes = Map.of(resource, ops);
            AdminCommands.await(admin.incrementalAlterConfigs(changes, alter).all(), options);
            System.out.println(Json.object("altered", resource.name()));
            admin.close(Duration.ofSeconds(5));
        }
        return 0;
    }

    /**
     * create-partitions --topic NAME --count N [--assignments "B,B;B"] [--validate-only true]:
     * grow the topic to N partitions (assignments: each new partition's brokers, partitions
     * separated by ';'); prints {"created": {"topic": NAME, "count": N}}.
     */
    static int createPartitions(Options options) throws Exception {
        String topic = options.require("topic");
        int count = Integer.parseInt(options.require("count"));
        String assignmentText = options.get("assignments", "");
        NewPartitions partitions;
        if (assignmentText.isEmpty()) {
            partitions = NewPartitions.increaseTo(count);
        } else {
            List<List<Integer>> assignments = new ArrayList<>();
            for (String partition : assignmentText.split(";")) {
                List<Integer> brokers = new ArrayList<>();
                for (String broker : items(partition)) {
                    brokers.add(Integer.parseInt(broker));
                }
                assignments.add(brokers);
            }
            partitions = NewPartitions.increaseTo(count, assignments);
        }
        CreatePartitionsOptions create = new CreatePartitionsOptions()
                .validateOnly(Boolean.parseBoolean(options.get("validate-only", "false")));
        try (Admin admin = Admin.create(options.clientProperties())) {
            AdminCommands.await(admin.createPartitions(Map.of(topic, partitions), create).all(), options);
            Map<String, Object> created = new LinkedHashMap<>();
            created.put("topic", topic);
            created.put("count", count);
            System.out.println(Json.object("created", created));
            admin.close(Duration.ofSeconds(5));
        }
        return 0;
    }

    private static ConfigResource resource(Options options) {
        String topic = options.get("topic", null);
        if (topic != null) {
            return new ConfigResource(ConfigResource.Type.TOPIC, topic);
        }
        return new ConfigResource(ConfigResource.Type.BROKER, options.require("broker"));
    }

    private static List<String> items(String text) {
        List<String> items = new ArrayList<>();
        for (String item : text.split(",")) {
            if (!item.isEmpty()) {
                items.add(item);
            }
        }
        return items;
    }

    private static List<String[]> pairs(String text) {
        List<String[]> pairs = new ArrayList<>();
        for (String item : items(text)) {
            String[] kv = item.split("=", 2);
            if (kv.length != 2) {
                throw new IllegalArgumentException("expected KEY=VALUE, got: " + item);
            }
            pairs.add(kv);
        }
        return pairs;
    }
}
