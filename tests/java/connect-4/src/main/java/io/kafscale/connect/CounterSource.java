package io.kafscale.connect;

import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.source.SourceConnector;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

/**
 * A source connector that writes 0, 1, 2, ... to the topic "topic" (config), one number every
 * "interval.ms", each record carrying its number as its source offset. A task starts after the
 * offset Connect stored for it: a worker restarted from its offsets topic carries on the
 * sequence instead of starting it again.
 */
public final class CounterSource extends SourceConnector {
  private Map<String, String> config;

  @Override
  public void start(Map<String, String> props) {
    config = props;
  }

  @Override
  public Class<? extends Task> taskClass() {
    return CounterTask.class;
  }

  @Override
  public List<Map<String, String>> taskConfigs(int maxTasks) {
    return List.of(config);
  }

  @Override
  public void stop() {}

  @Override
  public ConfigDef config() {
    return new ConfigDef()
        .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "Where to write")
        .define(
            "interval.ms", ConfigDef.Type.LONG, 20L, ConfigDef.Importance.LOW, "Between records");
  }

  @Override
  public String version() {
    return "1";
  }

  /** The one task of a CounterSource. */
  public static final class CounterTask extends SourceTask {
    private static final Map<String, String> PARTITION = Map.of("counter", "0");
    private String topic;
    private long interval;
    private long next;

    @Override
    public void start(Map<String, String> props) {
      topic = props.get("topic");
      interval = Long.parseLong(props.getOrDefault("interval.ms", "20"));
      Map<String, Object> stored = context.offsetStorageReader().offset(PARTITION);
      next = stored == null ? 0 : ((Number) stored.get("n")).longValue() + 1;
    }

    @Override
    public List<SourceRecord> poll() throws InterruptedException {
      Thread.sleep(interval);
      long n = next++;
      return List.of(
          new SourceRecord(
              PARTITION, Map.of("n", n), topic, 0, Schema.STRING_SCHEMA, "counter",
              Schema.INT64_SCHEMA, n));
    }

    @Override
    public void stop() {}

    @Override
    public String version() {
      return "1";
    }
  }
}
