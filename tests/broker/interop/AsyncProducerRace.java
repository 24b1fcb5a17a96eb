// Java Luxun's own async Producer against a broker, then its SimpleConsumer at once.
//
// Usage: java AsyncProducerRace HOST PORT TOPIC_PREFIX ROUNDS
//
// Each round: upstream com.leansoft.luxun.producer.Producer with producer.type=async,
// compression.codec=1 (gzip) and batch.size=50 sends 500 messages to a new topic
// (TOPIC_PREFIX-<round>) and is closed; then a new SimpleConsumer (a new connection)
// calls consume(topic, 0, 1 MiB) at once. Against a broker that shows a topic before
// its first batch is appended, that consume throws "topic ... is empty".
//
// Prints one line "ASYNC_RACE {json}" (per round: messages read, or the exception) and
// exits 0 when no consume threw, 1 when one did, 2 on a usage error.
//
// Compiled by tests/broker/test_lifecycle.py against the Java Luxun build's classpath
// ($LUXUN_JAVA_PEER/build/classpath.txt); nothing of that build is kept in the repo.

import com.leansoft.luxun.consumer.SimpleConsumer;
import com.leansoft.luxun.message.MessageList;
import com.leansoft.luxun.producer.Producer;
import com.leansoft.luxun.producer.ProducerConfig;
import com.leansoft.luxun.producer.ProducerData;
import com.leansoft.luxun.serializer.StringEncoder;
import java.util.List;
import java.util.Properties;

public final class AsyncProducerRace {
    static final int MESSAGES = 500;

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: AsyncProducerRace HOST PORT TOPIC_PREFIX ROUNDS");
            System.exit(2);
        }
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        String prefix = args[2];
        int rounds = Integer.parseInt(args[3]);
        StringBuilder json = new StringBuilder("{\"rounds\": [");
        int failures = 0;
        for (int round = 0; round < rounds; round++) {
            String topic = prefix + "-" + round;
            Properties props = new Properties();
            props.put("serializer.class", StringEncoder.class.getName());
            props.put("broker.list", "0:" + host + ":" + port);
            props.put("producer.type", "async");
            props.put("compression.codec", "1");
            props.put("batch.size", "50");
            Producer<String, String> producer = new Producer<String, String>(new ProducerConfig(props));
            for (int i = 0; i < MESSAGES; i++) {
                producer.send(new ProducerData<String, String>(topic, "message-" + i));
            }
            producer.close();
            SimpleConsumer consumer = new SimpleConsumer(host, port, 60000);
            String outcome;
            try {
                List<MessageList> lists = consumer.consume(topic, 0, 1024 * 1024);
                int count = 0;
                for (MessageList list : lists) {
                    count += list.size();
                }
                outcome = String.valueOf(count);
            } catch (Exception e) {
                failures++;
                outcome = "\"" + (e.getClass().getSimpleName() + ": " + e.getMessage()).replace("\"", "'") + "\"";
            } finally {
                consumer.close();
            }
            json.append(round == 0 ? "" : ", ").append(outcome);
        }
        json.append("], \"failures\": ").append(failures).append("}");
        System.out.println("ASYNC_RACE " + json);
        System.exit(failures == 0 ? 0 : 1);
    }
}
