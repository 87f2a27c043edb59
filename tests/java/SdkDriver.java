// Drives a running hourglass node with camellia-delay-queue's own Java SDK
// (tests/java/lib, unchanged) and prints what each SDK call returned, one
// "key value" line each, for tests/integration/test_camellia_sdk.py to check.
//
//   java -cp <classpath> SdkDriver http://127.0.0.1:PORT TOPIC_PREFIX

import com.netease.nim.camellia.delayqueue.common.domain.*;
import com.netease.nim.camellia.delayqueue.common.exception.CamelliaDelayQueueException;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayMsgListenerConfig;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayQueueSdk;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayQueueSdkConfig;
import com.netease.nim.camellia.delayqueue.sdk.api.CamelliaDelayQueueApi;

import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

public class SdkDriver {
    static void out(String key, Object value) {
        System.out.println(key + " " + value);
        System.out.flush();
    }

    static String describe(CamelliaDelayMsg m) {
        return m == null ? "null" : m.getMsgId() + ":" + m.getMsg() + ":" + m.getStatus() + ":" + m.getRetry();
    }

    static String error(Runnable call) {
        try {
            call.run();
            return "none";
        } catch (CamelliaDelayQueueException e) {
            return e.getErrorCode().name();
        } catch (RuntimeException e) {
            return e.getClass().getSimpleName();
        }
    }

    static void waitFor(java.util.function.BooleanSupplier done, long millis) throws InterruptedException {
        long deadline = System.currentTimeMillis() + millis;
        while (!done.getAsBoolean() && System.currentTimeMillis() < deadline) {
            Thread.sleep(20);
        }
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        String t = args[1];
        CamelliaDelayQueueSdkConfig config = new CamelliaDelayQueueSdkConfig();
        config.setUrl(url);
        CamelliaDelayQueueSdk sdk = new CamelliaDelayQueueSdk(config);
        CamelliaDelayQueueApi api = new CamelliaDelayQueueApi(config);

        // send, duplicate id, get, delete
        out("send", describe(sdk.sendMsg(t + "-a", "a1", "hello", 60, TimeUnit.SECONDS)));
        out("send_duplicate", describe(sdk.sendMsg(t + "-a", "a1", "other", 1, TimeUnit.SECONDS)));
        out("get", describe(sdk.getMsg(t + "-a", "a1")));
        out("get_missing", describe(sdk.getMsg(t + "-a", "nope")));
        out("delete", sdk.deleteMsg(t + "-a", "a1"));
        out("delete_again", sdk.deleteMsg(t + "-a", "a1"));
        out("delete_missing", sdk.deleteMsg(t + "-a", "nope"));
        out("get_deleted", describe(sdk.getMsg(t + "-a", "a1")));
        out("delete_release", sdk.deleteMsg(t + "-a", "a1", true));
        out("get_released", describe(sdk.getMsg(t + "-a", "a1")));
        out("send_past_trigger", describe(sdk.sendMsgByTriggerTime(t + "-p", "past", "due", System.currentTimeMillis() - 5000)));
        out("send_zero_delay", describe(sdk.sendMsg(t + "-p", "zero", "now", 0, TimeUnit.MILLISECONDS)));
        out("send_empty_msg_error", error(() -> sdk.sendMsg(t + "-a", "", 1000)));

        // pull, ack, nack, long poll through the API object
        CamelliaDelayMsgPullRequest pull = new CamelliaDelayMsgPullRequest();
        pull.setTopic(t + "-p");
        pull.setBatch(10);
        pull.setAckTimeoutMillis(30000);
        CamelliaDelayMsgPullResponse pulled = api.pullMsg(pull);
        StringBuilder ids = new StringBuilder();
        for (CamelliaDelayMsg m : pulled.getDelayMsgList()) ids.append(describe(m)).append(",");
        out("pull_code", pulled.getCode());
        out("pull", ids);
        CamelliaDelayMsgAckRequest ack = new CamelliaDelayMsgAckRequest();
        ack.setTopic(t + "-p");
        ack.setMsgId("past");
        ack.setAck(true);
        out("ack_code", api.ackMsg(ack).getCode());
        out("get_acked", describe(sdk.getMsg(t + "-p", "past")));
        CamelliaDelayMsgAckRequest nack = new CamelliaDelayMsgAckRequest();
        nack.setTopic(t + "-p");
        nack.setMsgId("zero");
        nack.setAck(false);
        out("nack_code", api.ackMsg(nack).getCode());
        out("get_nacked", describe(sdk.getMsg(t + "-p", "zero")));
        CamelliaDelayMsgAckRequest unknown = new CamelliaDelayMsgAckRequest();
        unknown.setTopic(t + "-p");
        unknown.setMsgId("nope");
        unknown.setAck(true);
        out("ack_unknown_code", api.ackMsg(unknown).getCode());
        CamelliaDelayMsgPullRequest empty = new CamelliaDelayMsgPullRequest();
        empty.setTopic(t + "-never");
        empty.setBatch(1);
        empty.setAckTimeoutMillis(30000);
        long started = System.currentTimeMillis();
        CamelliaDelayMsgPullResponse polled = api.longPollingMsg(empty, 1000);
        out("long_poll_empty", polled.getCode() + ":" + polled.getDelayMsgList().size());
        out("long_poll_waited_ms_at_least_900", System.currentTimeMillis() - started >= 900);
        sdk.sendMsg(t + "-lp", "soon", "x", 300, TimeUnit.MILLISECONDS);
        CamelliaDelayMsgPullRequest lp = new CamelliaDelayMsgPullRequest();
        lp.setTopic(t + "-lp");
        lp.setBatch(1);
        lp.setAckTimeoutMillis(30000);
        CamelliaDelayMsgPullResponse woke = api.longPollingMsg(lp, 5000);
        out("long_poll_woken", woke.getDelayMsgList().size() == 1 ? describe(woke.getDelayMsgList().get(0)) : "none");

        // the long-polling listener: ok acked, boom throws once, never always nacks (maxRetry 1)
        String lt = t + "-listen";
        Map<String, AtomicInteger> deliveries = new ConcurrentHashMap<>();
        CamelliaDelayMsgListenerConfig listen = new CamelliaDelayMsgListenerConfig();
        listen.setLongPollingEnable(true);
        listen.setLongPollingTimeoutMillis(2000);
        listen.setAckTimeoutMillis(1000);
        listen.setPullBatch(5);
        long id = sdk.addMsgListener(lt, listen, m -> {
            int n = deliveries.computeIfAbsent(m.getMsgId(), k -> new AtomicInteger()).incrementAndGet();
            if (m.getMsgId().equals("boom") && n == 1) throw new IllegalStateException("first delivery fails");
            return !m.getMsgId().equals("never");
        });
        sdk.sendMsg(lt, "ok", "fine", 0, TimeUnit.MILLISECONDS);
        sdk.sendMsg(lt, "boom", "fails once", 0, TimeUnit.MILLISECONDS);
        sdk.sendMsg(lt, "never", "always nacked", 0, TimeUnit.MILLISECONDS, 60, TimeUnit.SECONDS, 1);
        waitFor(() -> {
            CamelliaDelayMsg ok = sdk.getMsg(lt, "ok"), boom = sdk.getMsg(lt, "boom"), never = sdk.getMsg(lt, "never");
            return ok.getStatus() == 4 && boom.getStatus() == 4 && never.getStatus() == 6;
        }, 20000);
        out("listener_ok", describe(sdk.getMsg(lt, "ok")));
        out("listener_boom", describe(sdk.getMsg(lt, "boom")));
        out("listener_never", describe(sdk.getMsg(lt, "never")));
        out("listener_deliveries", "ok=" + deliveries.get("ok") + ",boom=" + deliveries.get("boom")
                + ",never=" + deliveries.get("never"));
        out("listener_removed", sdk.removeMsgListener(id));
        out("done", true);
        System.exit(0);
    }
}
