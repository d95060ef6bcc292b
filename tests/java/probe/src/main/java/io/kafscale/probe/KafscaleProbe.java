package io.kafscale.probe;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;

/**
 * A real Kafka Java client driven from KafScale's Python tests.
 *
 * <p>Usage: {@code KafscaleProbe COMMAND [--option value ...]}. Every command prints one JSON
 * document on stdout and exits 0 (except {@code consume}, {@code group-consume} and
 * {@code produce-load}, which stream JSON lines: see {@link RecordCommands#consume},
 * {@link GroupCommands} and {@link LoadCommands}); on failure it prints
 * one JSON line {@code {"error": CLASS, "message": ...}} and the stack trace on stderr and exits 1
 * (2 for a usage error). Kafka's own logging goes to stderr at WARN unless
 * {@code KAFSCALE_PROBE_LOG_LEVEL} says otherwise, so stdout stays machine-readable. JSON keys are
 * camelCase, as in the Java API ({@code clusterId}, {@code topicId}).
 *
 * <p>The probe is compiled against the kafka-clients 3.9 API and run with 3.9 or 4.x jars, so it
 * may only use APIs that exist in both. Add a command by adding an entry to {@link #COMMANDS}.
 */
public final class KafscaleProbe {

    /** One probe command: reads its options, prints its JSON result, returns the exit code. */
    @FunctionalInterface
    interface Command {
        int run(Options options) throws Exception;
    }

    static final Map<String, Command> COMMANDS = new LinkedHashMap<>();

    static {
        COMMANDS.put("version", AdminCommands::version);
        COMMANDS.put("describe-cluster", AdminCommands::describeCluster);
        COMMANDS.put("list-topics", AdminCommands::listTopics);
        COMMANDS.put("create-topic", AdminCommands::createTopic);
        COMMANDS.put("delete-topic", AdminCommands::deleteTopic);
        COMMANDS.put("describe-configs", ConfigCommands::describeConfigs);
        COMMANDS.put("alter-configs", ConfigCommands::alterConfigs);
        COMMANDS.put("create-partitions", ConfigCommands::createPartitions);
        COMMANDS.put("produce", ProduceCommands::produce);
        COMMANDS.put("produce-records", RecordCommands::produceRecords);
        COMMANDS.put("consume", RecordCommands::consume);
        COMMANDS.put("group-consume", GroupCommands::groupConsume);
        COMMANDS.put("produce-load", LoadCommands::produceLoad);
    }

    private KafscaleProbe() {}

    public static void main(String[] args) {
        configureLogging();
        System.exit(run(args));
    }

    static int run(String[] args) {
        if (args.length == 0 || !COMMANDS.containsKey(args[0])) {
            System.err.println("usage: KafscaleProbe {" + String.join("|", COMMANDS.keySet())
                    + "} [--bootstrap HOST:PORT] [--timeout-ms N] [--config KEY=VALUE ...]");
            return 2;
        }
        Options options;
        try {
            options = Options.parse(args, 1);
        } catch (IllegalArgumentException e) {
            System.err.println(Json.object("error", "usage", "message", e.getMessage()));
            return 2;
        }
        try {
            return COMMANDS.get(args[0]).run(options);
        } catch (Throwable t) {
            Throwable cause = t instanceof ExecutionException && t.getCause() != null ? t.getCause() : t;
            System.err.println(Json.object("error", cause.getClass().getName(), "message", cause.getMessage()));
            StringWriter trace = new StringWriter();
            cause.printStackTrace(new PrintWriter(trace));
            System.err.print(trace);
            System.err.flush();
            return 1;
        }
    }

    /** slf4j-simple reads these once, when the first logger is made: set them before that. */
    private static void configureLogging() {
        String level = System.getenv().getOrDefault("KAFSCALE_PROBE_LOG_LEVEL", "warn");
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", level);
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
    }
}
