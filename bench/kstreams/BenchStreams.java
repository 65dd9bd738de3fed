import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;

/**
 * kafka-streams-eos: the benchmark job of bench/run.py as a Kafka Streams application.
 *
 * <p>For each JSON input row: decode it (Jackson), check it against the input schema of bench/workload.py (a
 * row that is not a JSON object of those field types goes, as its original bytes, to the dead-letter topic),
 * drop it when {@code amount < 0}, and write {@code {"id", "user", "amount2": amount * 2, "ts"}} with the types
 * epochline's JSON sink writes (id integer, user string, amount2 double, ts an RFC 3339 UTC string with
 * milliseconds). {@code processing.guarantee=exactly_once_v2}, {@code commit.interval.ms=1000}.
 *
 * <p>{@code --bounded}: the input's end offsets are read at start; once the application's committed offsets
 * reach them on every partition it closes and exits 0. Otherwise it runs until SIGTERM and closes cleanly.
 * A stream thread that dies shuts the client down and the process exits 1.
 *
 * <p>Usage: {@code java -cp CLASSPATH BenchStreams --bootstrap B --input T --output T --dead-letter T
 * --application-id ID --threads N --state-dir DIR [--bounded]}
 */
public final class BenchStreams {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final DateTimeFormatter MILLIS =
      DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);
  private static final AtomicLong DEAD_LETTERS = new AtomicLong();
  private static final long POLL_MS = 200;

  private BenchStreams() {}

  enum Kind { OUTPUT, DROPPED, DEAD_LETTER }

  /** What one input value became: an output row, nothing (filtered out), or a dead letter (its input bytes). */
  record Outcome(Kind kind, byte[] value) {}

  private static final Outcome DROPPED = new Outcome(Kind.DROPPED, null);

  static Outcome transform(byte[] value) {
    if (value == null) {
      return deadLetter(null);
    }
    try {
      JsonNode row = JSON.readTree(value);
      if (!conforms(row)) {
        return deadLetter(value);
      }
      double amount = row.get("amount").asDouble();
      Instant ts = Instant.parse(row.get("ts").textValue());
      if (amount < 0) { // WHERE amount >= 0
        return DROPPED;
      }
      ObjectNode out = JSON.createObjectNode();
      out.put("id", row.get("id").longValue());
      out.put("user", row.get("user").textValue());
      out.put("amount2", amount * 2);
      out.put("ts", MILLIS.format(ts));
      return new Outcome(Kind.OUTPUT, JSON.writeValueAsBytes(out));
    } catch (IOException | DateTimeParseException e) {
      return deadLetter(value);
    }
  }

  /** The input schema of bench/workload.py: every field present and non-null, of its JSON type. */
  private static boolean conforms(JsonNode row) {
    if (row == null || !row.isObject()) {
      return false;
    }
    JsonNode id = row.get("id");
    JsonNode amount = row.get("amount");
    JsonNode flag = row.get("flag");
    return id != null && id.isIntegralNumber() && id.canConvertToLong()
        && amount != null && amount.isNumber()
        && flag != null && flag.isBoolean()
        && isText(row, "user") && isText(row, "ts") && isText(row, "country")
        && isText(row, "product") && isText(row, "session");
  }

  private static boolean isText(JsonNode row, String field) {
    JsonNode value = row.get(field);
    return value != null && value.isTextual();
  }

  private static Outcome deadLetter(byte[] value) {
    DEAD_LETTERS.incrementAndGet();
    return new Outcome(Kind.DEAD_LETTER, value);
  }

  static Topology topology(String input, String output, String deadLetter) {
    Serde<byte[]> bytes = Serdes.ByteArray();
    StreamsBuilder builder = new StreamsBuilder();
    KStream<byte[], Outcome> outcomes =
        builder.stream(input, Consumed.with(bytes, bytes)).mapValues(BenchStreams::transform);
    outcomes.filter((key, outcome) -> outcome.kind() == Kind.OUTPUT)
        .mapValues(Outcome::value)
        .to(output, Produced.with(bytes, bytes));
    outcomes.filter((key, outcome) -> outcome.kind() == Kind.DEAD_LETTER)
        .mapValues(Outcome::value)
        .to(deadLetter, Produced.with(bytes, bytes));
    return builder.build();
  }

  static Properties settings(Map<String, String> args) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("application-id"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args.get("threads")));
    props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    return props;
  }

  /** The input's end offsets (last stable offsets) now: a bounded run is done once they are committed. */
  static Map<TopicPartition, Long> endOffsets(Admin admin, String topic) throws Exception {
    TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS)
        .get(topic);
    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
    for (TopicPartitionInfo partition : description.partitions()) {
      latest.put(new TopicPartition(topic, partition.partition()), OffsetSpec.latest());
    }
    Map<TopicPartition, ListOffsetsResultInfo> found = admin
        .listOffsets(latest, new ListOffsetsOptions(IsolationLevel.READ_COMMITTED)).all().get(60, TimeUnit.SECONDS);
    Map<TopicPartition, Long> ends = new HashMap<>();
    found.forEach((partition, info) -> ends.put(partition, info.offset()));
    return ends;
  }

  static boolean committedUpTo(Admin admin, String groupId, Map<TopicPartition, Long> ends) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(groupId)
        .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
    for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
      if (end.getValue() == 0) {
        continue;
      }
      OffsetAndMetadata offset = committed.get(end.getKey());
      if (offset == null || offset.offset() < end.getValue()) {
        return false;
      }
    }
    return true;
  }

  static Map<String, String> parse(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + argv[i]);
      }
      String name = argv[i].substring(2);
      if (name.equals("bounded")) {
        args.put(name, "true");
      } else if (i + 1 < argv.length) {
        args.put(name, argv[++i]);
      } else {
        throw new IllegalArgumentException("--" + name + " needs a value");
      }
    }
    for (String required : List.of("bootstrap", "input", "output", "dead-letter", "application-id", "threads",
        "state-dir")) {
      if (!args.containsKey(required)) {
        throw new IllegalArgumentException("--" + required + " is required");
      }
    }
    return args;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parse(argv);
    boolean bounded = args.containsKey("bounded");
    long started = System.nanoTime();
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
    int exitCode;
    try (Admin admin = Admin.create(adminProps)) {
      Map<TopicPartition, Long> ends = bounded ? endOffsets(admin, args.get("input")) : null;
      KafkaStreams streams = new KafkaStreams(
          topology(args.get("input"), args.get("output"), args.get("dead-letter")), settings(args));
      CountDownLatch closed = new CountDownLatch(1);
      streams.setUncaughtExceptionHandler(error -> {
        System.err.println("kafka-streams-eos: stream thread failed: " + error);
        return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
      });
      Runtime.getRuntime().addShutdownHook(new Thread(() -> {
        streams.close(Duration.ofSeconds(30));
        closed.countDown();
      }, "bench-shutdown"));
      streams.start();
      exitCode = runUntilDone(streams, admin, args.get("application-id"), ends, closed);
      if (exitCode < 0) { // SIGTERM: the shutdown hook closes the client and the JVM exits
        return;
      }
      System.err.printf("kafka-streams-eos: %s after %.2f s, closing%n",
          exitCode == 0 ? "input committed" : "failed", seconds(started));
      if (!streams.close(Duration.ofSeconds(60))) {
        System.err.println("kafka-streams-eos: the client did not close within 60 s");
        exitCode = 1;
      }
      System.err.printf("kafka-streams-eos: closed after %.2f s%n", seconds(started));
      report();
    }
    System.exit(exitCode);
  }

  /** 0 once a bounded run's input is committed, 1 when the client failed, -1 when SIGTERM closed it. */
  private static int runUntilDone(KafkaStreams streams, Admin admin, String groupId, Map<TopicPartition, Long> ends,
      CountDownLatch closed) throws InterruptedException {
    while (true) {
      KafkaStreams.State state = streams.state();
      if (state == KafkaStreams.State.ERROR || state == KafkaStreams.State.PENDING_ERROR) {
        return 1;
      }
      if (ends != null) {
        try {
          if (committedUpTo(admin, groupId, ends)) {
            return 0;
          }
        } catch (InterruptedException e) {
          throw e;
        } catch (Exception e) { // the group's offsets could not be read this time: ask again
          System.err.println("kafka-streams-eos: reading the committed offsets failed, retrying: " + e);
        }
      }
      if (closed.await(POLL_MS, TimeUnit.MILLISECONDS)) {
        return -1;
      }
    }
  }

  private static double seconds(long since) {
    return (System.nanoTime() - since) / 1e9;
  }

  private static void report() {
    if (DEAD_LETTERS.get() > 0) {
      System.err.println("kafka-streams-eos: " + DEAD_LETTERS.get() + " malformed input records dead-lettered");
    }
  }
}
