// Reads and writes a bigqueue 0.7.2 FanOutQueue directory with the Java code of
// bigqueue 0.7.2 and Java Luxun 0.6.2 (FanOutQueueImplEx and its batchDequeue, what
// the Luxun broker serves consume calls with), for tests/bigarray/test_java_interop.py.
//
//   write <parent> <name> <pageSize> <count> <group> <dequeues>
//       enqueue items 0..count-1 (see item() and size()), then dequeue <dequeues> items
//       for <group>.
//   read <parent> <name> <pageSize> <dumpFile> <group> <batchBytes> <appendFrom> <appendCount>
//       dump every item from tail to head to <dumpFile> (i64 index, i32 length, bytes),
//       take one batchDequeue of up to <batchBytes> for <group>, then enqueue items
//       appendFrom..appendFrom+appendCount-1.
//
// Prints one line: BQ_INTEROP {json}.
import com.leansoft.bigqueue.FanOutQueueImplEx;
import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.FileOutputStream;
import java.nio.ByteBuffer;

public class BigQueueInterop {
    /** Item sizes: every tenth item 150 KB and more, the others 1..500 bytes. */
    static int size(long i) {
        return i % 10 == 0 ? 150_000 + (int) i : 1 + (int) ((i * 37) % 500);
    }

    /** Item bytes: (i * 31 + k * 7) & 0xff, so every byte value occurs. */
    static byte[] item(long i) {
        int n = size(i);
        byte[] b = new byte[n];
        for (int k = 0; k < n; k++) {
            b[k] = (byte) ((i * 31 + k * 7L) & 0xff);
        }
        return b;
    }

    public static void main(String[] a) throws Exception {
        String mode = a[0];
        FanOutQueueImplEx q = new FanOutQueueImplEx(a[1], a[2], Integer.parseInt(a[3]));
        StringBuilder out = new StringBuilder("{");
        try {
            if (mode.equals("write")) {
                long count = Long.parseLong(a[4]);
                for (long i = 0; i < count; i++) {
                    long idx = q.enqueue(item(i));
                    if (idx != i) throw new IllegalStateException("enqueue gave index " + idx + " for item " + i);
                }
                int dequeues = Integer.parseInt(a[6]);
                for (int k = 0; k < dequeues; k++) q.dequeue(a[5]);
                out.append("\"group_index\":").append(q.getFrontIndex(a[5]));
            } else if (mode.equals("read")) {
                long tail = q.getFrontIndex(), head = q.getRearIndex();
                try (DataOutputStream dump = new DataOutputStream(new BufferedOutputStream(new FileOutputStream(a[4])))) {
                    for (long i = tail; i < head; i++) {
                        byte[] b = q.get(i);
                        dump.writeLong(i);
                        dump.writeInt(b.length);
                        dump.write(b);
                    }
                }
                String group = a[5];
                long groupBefore = q.getFrontIndex(group);
                FanOutQueueImplEx.BatchReadResult batch = q.batchDequeue(group, Integer.parseInt(a[6]));
                long expect = groupBefore;
                for (ByteBuffer buf : batch.bufferList) {
                    byte[] got = new byte[buf.remaining()];
                    buf.get(got);
                    if (!java.util.Arrays.equals(got, item(expect))) {
                        throw new IllegalStateException("batchDequeue gave wrong bytes for index " + expect);
                    }
                    expect++;
                }
                long from = Long.parseLong(a[7]), n = Long.parseLong(a[8]);
                for (long i = from; i < from + n; i++) {
                    long idx = q.enqueue(item(i));
                    if (idx != i) throw new IllegalStateException("enqueue gave index " + idx + " for item " + i);
                }
                out.append("\"tail\":").append(tail).append(",\"head\":").append(head);
                out.append(",\"group_before\":").append(groupBefore);
                out.append(",\"batch_items\":").append(batch.bufferList.size());
                out.append(",\"group_after\":").append(q.getFrontIndex(group));
                out.append(",\"head_after\":").append(q.getRearIndex());
            } else {
                throw new IllegalArgumentException("mode must be write or read, not " + mode);
            }
        } finally {
            q.close();
        }
        System.out.println("BQ_INTEROP " + out.append("}"));
    }
}
