// Java Luxun's LazyInitProducerTest pattern, many rounds: SyncProducer.send (a oneway
// asyncProduce) on one connection, then at once a consume on another (SimpleConsumer).
//
// Usage: java ProduceThenConsumeOrder HOST PORT TOPIC_PREFIX ROUNDS
//
// One SyncProducer and one SimpleConsumer, each with its own connection, kept for the
// whole run (as the JUnit harness keeps them for a test). Each round:
//   1. send a MessageList of two messages to a new topic (PREFIX-new-<round>), then
//      multiConsume([by index 0, fetch 10000]) and read response.getItemList() as the
//      upstream tests do (a reply without itemList is a NullPointerException there);
//   2. send message <round> to PREFIX-shared, then consume(PREFIX-shared, <round>, 10000)
//      by index: exactly that message;
//   3. consume(PREFIX-shared, "fan", 10000) by group: exactly that message.
// Java's broker (one selector thread) answers every consume after the sends before it.
//
// Prints one line "ORDER {json}" (rounds, failures by step, the first few failures) and
// exits 0 when every answer was the one expected, 1 when not, 2 on a usage error.
//
// Compiled by tests/broker/test_order.py against the Java Luxun build's classpath
// ($LUXUN_JAVA_PEER/build/classpath.txt); nothing of that build is kept in the repo.

import com.leansoft.luxun.api.generated.ConsumeRequest;
import com.leansoft.luxun.api.generated.ConsumeResponse;
import com.leansoft.luxun.consumer.SimpleConsumer;
import com.leansoft.luxun.message.Message;
import com.leansoft.luxun.message.MessageList;
import com.leansoft.luxun.producer.SyncProducer;
import com.leansoft.luxun.producer.SyncProducerConfig;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;

public final class ProduceThenConsumeOrder {
    static final int EXAMPLES = 5;

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: ProduceThenConsumeOrder HOST PORT TOPIC_PREFIX ROUNDS");
            System.exit(2);
        }
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        String prefix = args[2];
        int rounds = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put("host", host);
        props.put("port", String.valueOf(port));
        props.put("connect.timeout.ms", "100000");
        props.put("reconnect.interval", "10000");
        SyncProducer producer = new SyncProducer(new SyncProducerConfig(props));
        SimpleConsumer consumer = new SimpleConsumer(host, port, 1000000);
        String shared = prefix + "-shared";
        int[] failures = new int[3];
        List<String> examples = new ArrayList<String>();
        for (int round = 0; round < rounds; round++) {
            // 1. a new topic, read by index with multiConsume (the upstream multi-fetch tests)
            String topic = prefix + "-new-" + round;
            MessageList pair = new MessageList();
            pair.add(new Message(("a-" + round).getBytes("UTF-8")));
            pair.add(new Message(("b-" + round).getBytes("UTF-8")));
            producer.send(topic, pair);
            ConsumeRequest request = new ConsumeRequest();
            request.setTopic(topic);
            request.setStartIndex(0);
            request.setMaxFetchSize(10000);
            String outcome;
            try {
                ConsumeResponse response = consumer.multiConsume(Collections.singletonList(request)).get(0);
                List<MessageList> lists = new ArrayList<MessageList>();
                for (ByteBuffer buffer : response.getItemList()) {
                    lists.add(MessageList.fromThriftBuffer(buffer));
                }
                outcome = lists.size() == 1 && same(pair, lists.get(0)) ? null
                        : lists.size() + " lists (" + response.getResult() + ")";
            } catch (Exception e) {
                outcome = e.getClass().getSimpleName() + ": " + e.getMessage();
            }
            note(failures, examples, 0, round, outcome);
            // 2. one more message on a shared topic, read by its index
            MessageList one = new MessageList();
            one.add(new Message(("m-" + round).getBytes("UTF-8")));
            producer.send(shared, one);
            try {
                List<MessageList> lists = consumer.consume(shared, round, 10000);
                outcome = lists.size() == 1 && same(one, lists.get(0)) ? null : lists.size() + " lists";
            } catch (Exception e) {
                outcome = e.getClass().getSimpleName() + ": " + e.getMessage();
            }
            note(failures, examples, 1, round, outcome);
            // 3. the same message by group
            try {
                List<MessageList> lists = consumer.consume(shared, "fan", 10000);
                outcome = lists.size() == 1 && same(one, lists.get(0)) ? null : lists.size() + " lists";
            } catch (Exception e) {
                outcome = e.getClass().getSimpleName() + ": " + e.getMessage();
            }
            note(failures, examples, 2, round, outcome);
        }
        producer.close();
        consumer.close();
        StringBuilder json = new StringBuilder("{\"rounds\": ").append(rounds);
        json.append(", \"new_topic_by_index\": ").append(failures[0]);
        json.append(", \"by_index\": ").append(failures[1]);
        json.append(", \"by_group\": ").append(failures[2]);
        json.append(", \"examples\": [");
        for (int i = 0; i < examples.size(); i++) {
            json.append(i == 0 ? "" : ", ").append('"').append(examples.get(i).replace("\\", "/").replace("\"", "'")).append('"');
        }
        json.append("]}");
        System.out.println("ORDER " + json);
        System.exit(failures[0] + failures[1] + failures[2] == 0 ? 0 : 1);
    }

    static void note(int[] failures, List<String> examples, int step, int round, String outcome) {
        if (outcome == null) {
            return;
        }
        failures[step]++;
        if (examples.size() < EXAMPLES) {
            examples.add("round " + round + " step " + (step + 1) + ": " + outcome);
        }
    }

    static boolean same(MessageList a, MessageList b) {
        if (a.size() != b.size()) {
            return false;
        }
        for (int i = 0; i < a.size(); i++) {
            if (!a.get(i).equals(b.get(i))) {
                return false;
            }
        }
        return true;
    }
}
