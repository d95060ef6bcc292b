package io.kafscale.probe;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * Command-line options: {@code --name value} pairs; {@code --config KEY=VALUE} may repeat and is
 * passed to the Kafka client as is, after the probe's defaults (so it can override them).
 */
final class Options {
    private final Map<String, String> values = new HashMap<>();
    private final List<String> configs = new ArrayList<>();

    private Options() {}

    static Options parse(String[] args, int start) {
        Options options = new Options();
        for (int i = start; i < args.length; i += 2) {
            String name = args[i];
            if (!name.startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value, got: " + name);
            }
            String value = args[i + 1];
            if (name.equals("--config")) {
                if (!value.contains("=")) {
                    throw new IllegalArgumentException("--config needs KEY=VALUE, got: " + value);
                }
                options.configs.add(value);
            } else {
                options.values.put(name.substring(2), value);
            }
        }
        return options;
    }

    String require(String name) {
        String value = values.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    int timeoutMs() {
        return Integer.parseInt(get("timeout-ms", "20000"));
    }

    /** Client properties: bootstrap, timeouts, then every --config in order. */
    Properties clientProperties() {
        Properties props = new Properties();
        props.put("bootstrap.servers", require("bootstrap"));
        props.put("client.id", get("client-id", "kafscale-probe"));
        String timeout = Integer.toString(timeoutMs());
        props.put("request.timeout.ms", timeout);
        props.put("default.api.timeout.ms", timeout);
        for (String config : configs) {
            int eq = config.indexOf('=');
            props.put(config.substring(0, eq), config.substring(eq + 1));
        }
        return props;
    }
}
