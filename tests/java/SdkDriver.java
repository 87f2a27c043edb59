import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import com.alibaba.fastjson.serializer.SerializerFeature;
import com.netease.nim.camellia.delayqueue.common.domain.CamelliaDelayMsg;
import com.netease.nim.camellia.delayqueue.common.domain.CamelliaDelayMsgAckRequest;
import com.netease.nim.camellia.delayqueue.common.domain.CamelliaDelayMsgAckResponse;
import com.netease.nim.camellia.delayqueue.common.domain.CamelliaDelayMsgPullRequest;
import com.netease.nim.camellia.delayqueue.common.domain.CamelliaDelayMsgPullResponse;
import com.netease.nim.camellia.delayqueue.common.exception.CamelliaDelayQueueException;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayMsgListener;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayMsgListenerConfig;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayQueueSdk;
import com.netease.nim.camellia.delayqueue.sdk.CamelliaDelayQueueSdkConfig;
import com.netease.nim.camellia.delayqueue.sdk.api.CamelliaDelayQueueApi;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;

/**
 * Drives camellia-delay-queue's own Java SDK (CamelliaDelayQueueSdk, and
 * CamelliaDelayQueueApi for the calls the SDK makes only inside its
 * listener: pull, long poll, ack, nack) against a hourglass server, and
 * prints what each call returned as one JSON line:
 *
 *   {"step":"get_missing","value":null}
 *   {"step":"send_empty_msg","error":{"code":"PARAM_WRONG","message":"..."}}
 *
 * The step names are what tests/conformance/test_camellia_sdk.py
 * asserts on; every step runs even if an earlier one threw.
 *
 * Usage: java -cp ... SdkDriver http://127.0.0.1:8080 topicPrefix
 */
public class SdkDriver {

    private static final long MINUTE = 60_000;

    private final CamelliaDelayQueueSdkConfig config;
    private final CamelliaDelayQueueSdk sdk;
    private final CamelliaDelayQueueApi api;
    private final String prefix;

    SdkDriver(String url, String prefix) {
        this.prefix = prefix;
        config = new CamelliaDelayQueueSdkConfig();
        config.setUrl(url);
        // the listener settings addMsgListener(topic, listener) takes
        config.getListenerConfig().setLongPollingTimeoutMillis(2000);
        config.getListenerConfig().setAckTimeoutMillis(30_000);
        sdk = new CamelliaDelayQueueSdk(config);
        api = new CamelliaDelayQueueApi(config);
    }

    public static void main(String[] args) throws Exception {
        SdkDriver driver = new SdkDriver(args[0], args[1]);
        driver.sends();
        driver.getAndDelete();
        driver.pullAckNack();
        driver.longPoll();
        driver.listeners();
        System.out.flush();
        System.exit(0);  // the listeners' pull threads may still be in a long poll
    }

    // == sendMsg in all its forms ===============================================================

    void sends() {
        String t = prefix + "-send";
        step("send", () -> sdk.sendMsg(t, "m1", "hello", 10 * MINUTE, 2 * MINUTE, 3));
        step("send_duplicate", () -> sdk.sendMsg(t, "m1", "other", 0, -1, -1));
        step("send_generated_id", () -> sdk.sendMsg(t, "gen", 10 * MINUTE, -1, -1));
        step("send_timeunit_id", () -> sdk.sendMsg(t, "m2", "tu", 10, TimeUnit.MINUTES, 2, TimeUnit.HOURS, 5));
        step("send_timeunit", () -> sdk.sendMsg(t, "tu2", 10, TimeUnit.MINUTES, 30, TimeUnit.MINUTES, 0));
        step("send_defaults", () -> sdk.sendMsg(t, "d", 10 * MINUTE));
        step("send_delay_unit", () -> sdk.sendMsg(t, "du", 5, TimeUnit.MINUTES));
        step("send_delay_unit_id", () -> sdk.sendMsg(t, "m3", "du2", 5, TimeUnit.MINUTES));
        step("send_now", () -> sdk.sendMsg(t, "m4", "now", 0, -1, -1));
        step("send_negative", () -> sdk.sendMsg(t, "m5", "neg", -5000, -1, -1));
        long past = System.currentTimeMillis() - MINUTE;
        step("send_by_trigger_past", () -> sdk.sendMsgByTriggerTime(t, "past", past));
        long future = System.currentTimeMillis() + 10 * MINUTE;
        step("send_by_trigger_id_requested", () -> future);
        step("send_by_trigger_id", () -> sdk.sendMsgByTriggerTime(t, "m6", "future", future));
        step("send_empty_msg", () -> sdk.sendMsg(t, "m7", "", 1000, -1, -1));
        // an ended message's id takes a new message (camellia replaces it)
        step("resend_ended_first", () -> sdk.sendMsg(t, "m8", "first", 10 * MINUTE, -1, -1));
        step("resend_ended_delete", () -> sdk.deleteMsg(t, "m8"));
        step("resend_ended", () -> sdk.sendMsg(t, "m8", "second", 10 * MINUTE, -1, -1));
    }

    // == getMsg, deleteMsg ======================================================================

    void getAndDelete() {
        String t = prefix + "-send";
        step("get", () -> sdk.getMsg(t, "m1"));
        step("get_missing", () -> sdk.getMsg(t, "nope"));
        step("get_unknown_topic", () -> sdk.getMsg(prefix + "-never", "nope"));
        step("delete", () -> sdk.deleteMsg(t, "m1"));
        step("get_deleted", () -> sdk.getMsg(t, "m1"));
        step("delete_again", () -> sdk.deleteMsg(t, "m1"));
        step("delete_missing", () -> sdk.deleteMsg(t, "nope"));
        step("delete_release", () -> sdk.deleteMsg(t, "m2", true));
        // the SDK does not send `release` (CamelliaDelayQueueApi.deleteMsg): the message stays readable
        step("get_after_release", () -> sdk.getMsg(t, "m2"));
    }

    // == pull, ack, nack through CamelliaDelayQueueApi ============================================

    void pullAckNack() {
        String t = prefix + "-pull";
        step("pull_unknown_topic", () -> pull(prefix + "-never", 10));
        step("pull_send", () -> sdk.sendMsg(t, "p1", "pull me", 0, -1, 5));
        step("pull", () -> pull(t, 10));
        step("pull_empty", () -> pull(t, 10));
        step("ack", () -> ack(t, "p1", true));
        step("get_acked", () -> sdk.getMsg(t, "p1"));
        step("ack_again", () -> ack(t, "p1", true));
        step("ack_unknown", () -> ack(t, "nope", true));
        step("nack_unknown", () -> ack(t, "nope", false));
        step("ack_waiting_send", () -> sdk.sendMsg(t, "p2", "never due", 10 * MINUTE, -1, -1));
        step("ack_waiting", () -> ack(t, "p2", true));
        step("get_ack_waiting", () -> sdk.getMsg(t, "p2"));
        step("nack_send", () -> sdk.sendMsg(t, "p3", "nack me", 0, -1, 5));
        step("nack_pull1", () -> pull(t, 10));
        step("nack", () -> ack(t, "p3", false));
        step("nack_pull2", () -> pull(t, 10));
        step("nack_ack", () -> ack(t, "p3", true));
        step("get_nacked_then_acked", () -> sdk.getMsg(t, "p3"));
    }

    private CamelliaDelayMsgPullResponse pull(String topic, int batch) {
        CamelliaDelayMsgPullRequest request = new CamelliaDelayMsgPullRequest();
        request.setTopic(topic);
        request.setBatch(batch);
        request.setAckTimeoutMillis(60_000);
        return api.pullMsg(request);
    }

    private CamelliaDelayMsgAckResponse ack(String topic, String msgId, boolean ack) {
        CamelliaDelayMsgAckRequest request = new CamelliaDelayMsgAckRequest();
        request.setTopic(topic);
        request.setMsgId(msgId);
        request.setAck(ack);
        return api.ackMsg(request);
    }

    // == longPollingMsg ===========================================================================

    void longPoll() {
        String t = prefix + "-poll";
        step("long_poll_empty", () -> timedLongPoll(t, 500));
        step("long_poll_send", () -> sdk.sendMsg(t, "lp1", "soon", 1500, -1, -1));
        step("long_poll", () -> timedLongPoll(t, 10_000));
        step("long_poll_ack", () -> ack(t, "lp1", true));
    }

    private Map<String, Object> timedLongPoll(String topic, long timeoutMillis) {
        CamelliaDelayMsgPullRequest request = new CamelliaDelayMsgPullRequest();
        request.setTopic(topic);
        request.setBatch(1);
        request.setAckTimeoutMillis(30_000);
        long started = System.currentTimeMillis();
        CamelliaDelayMsgPullResponse response = api.longPollingMsg(request, timeoutMillis);
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("response", response);
        out.put("startedAt", started);
        out.put("answeredAt", System.currentTimeMillis());
        return out;
    }

    // == the long-polling listener ================================================================

    void listeners() throws InterruptedException {
        String t = prefix + "-listen";
        String t2 = prefix + "-listen2";
        List<Map<String, Object>> deliveries = new ArrayList<>();
        CamelliaDelayMsgListener listener = delayMsg -> {
            synchronized (deliveries) {
                Map<String, Object> d = new LinkedHashMap<>();
                d.put("msgId", delayMsg.getMsgId());
                d.put("retry", delayMsg.getRetry());
                d.put("status", delayMsg.getStatus());
                d.put("at", System.currentTimeMillis());
                d.put("triggerTime", delayMsg.getTriggerTime());
                deliveries.add(d);
            }
            switch (delayMsg.getMsg()) {
                case "fail-once": return delayMsg.getRetry() > 1;  // false: the SDK nacks it
                case "throw-once":
                    if (delayMsg.getRetry() == 1) throw new IllegalStateException("listener failure (on purpose)");
                    return true;
                case "always-throw": throw new IllegalStateException("listener failure (on purpose)");
                default: return true;
            }
        };
        step("listen_send_ok", () -> sdk.sendMsg(t, "ok", "ok", 0, -1, -1));
        step("listen_send_fail_once", () -> sdk.sendMsg(t, "fail-once", "fail-once", 0, -1, -1));
        step("listen_send_throw_once", () -> sdk.sendMsg(t, "throw-once", "throw-once", 0, -1, -1));
        step("listen_send_always_throw", () -> sdk.sendMsg(t, "always-throw", "always-throw", 0, -1, 1));
        step("listen_send_delayed", () -> sdk.sendMsg(t, "delayed", "delayed", 1000, -1, -1));
        step("listen_send_two_arg", () -> sdk.sendMsg(t2, "two-arg", "two-arg", 0, -1, -1));

        CamelliaDelayMsgListenerConfig listenerConfig = new CamelliaDelayMsgListenerConfig();
        listenerConfig.setLongPollingEnable(true);
        // 6 minutes: above the server's maximum, which clamps it (an error would make the SDK re-poll at once)
        listenerConfig.setLongPollingTimeoutMillis(6 * MINUTE);
        listenerConfig.setAckTimeoutMillis(30_000);
        listenerConfig.setPullBatch(10);
        listenerConfig.setConsumeThreads(4);
        long[] ids = new long[2];
        step("add_listener", () -> ids[0] = sdk.addMsgListener(t, listenerConfig, listener));
        step("add_listener_two_arg", () -> ids[1] = sdk.addMsgListener(t2, listener));

        Map<String, int[]> expected = new LinkedHashMap<>();  // msgId -> the final statuses awaited
        expected.put("ok", new int[]{4});
        expected.put("fail-once", new int[]{4});
        expected.put("throw-once", new int[]{4});
        expected.put("always-throw", new int[]{6});
        expected.put("delayed", new int[]{4});
        long deadline = System.currentTimeMillis() + 30_000;
        while (System.currentTimeMillis() < deadline && !(settled(t, expected) && settled(t2, "two-arg", 4))) {
            Thread.sleep(100);
        }
        Thread.sleep(1000);  // anything delivered after the last state is counted too
        Map<String, Object> finals = new LinkedHashMap<>();
        for (String id : expected.keySet()) {
            finals.put(id, sdk.getMsg(t, id));
        }
        finals.put("two-arg", sdk.getMsg(t2, "two-arg"));
        step("listener_final", () -> finals);
        synchronized (deliveries) {
            List<Map<String, Object>> copy = new ArrayList<>(deliveries);
            step("listener_deliveries", () -> copy);
        }
        step("remove_listener", () -> sdk.removeMsgListener(ids[0]));
        step("remove_listener_two_arg", () -> sdk.removeMsgListener(ids[1]));
        step("remove_listener_again", () -> sdk.removeMsgListener(ids[0]));
    }

    private boolean settled(String topic, Map<String, int[]> expected) {
        for (Map.Entry<String, int[]> e : expected.entrySet()) {
            if (!settled(topic, e.getKey(), e.getValue()[0])) return false;
        }
        return true;
    }

    private boolean settled(String topic, String msgId, int status) {
        try {
            CamelliaDelayMsg m = sdk.getMsg(topic, msgId);
            return m != null && m.getStatus() == status;
        } catch (CamelliaDelayQueueException e) {
            return false;
        }
    }

    // == output ===================================================================================

    private static void step(String name, Callable<Object> body) {
        JSONObject line = new JSONObject(true);
        line.put("step", name);
        try {
            line.put("value", body.call());
        } catch (CamelliaDelayQueueException e) {
            JSONObject error = new JSONObject(true);
            error.put("code", e.getErrorCode() == null ? null : e.getErrorCode().name());
            error.put("message", e.getMessage());
            line.put("error", error);
        } catch (Exception e) {
            JSONObject error = new JSONObject(true);
            error.put("code", e.getClass().getName());
            error.put("message", e.getMessage());
            line.put("error", error);
        }
        System.out.println(JSON.toJSONString(line, SerializerFeature.WriteMapNullValue));
        System.out.flush();
    }
}
