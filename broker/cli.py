"""The `hourglass` command line: `hourglass serve [flags]`."""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys

from replication.config import Acks, ClusterConfig, parse_cluster, reach_peers
from storage.config import StoreConfig
from storage.errors import ConfigError, HourglassError

from .core.bodies import BodyLimits
from .core.params import Defaults
from .disk.ready import QueueLimits
from .flow.settings import DEFAULT_MAX_PAUSED_KEYS, DEFAULT_MAX_PAUSED_KEYS_TOTAL
from .http.httpd import Limits
from .http.sessions import ConsoleConfig
from .jobs.runner import JobLimits
from .node.config import ServeConfig, fsync_policy
from .observe.tracing import exporters_from_env
from .push.rules import DEFAULT_MAX_SUBSCRIPTIONS, PushLimits
from .schedules.keeper import ScheduleLimits

log = logging.getLogger("hourglass.cli")


class _PrintVersion(argparse.Action):
    """`--version`: the version and whether mypyc-compiled modules run
    (broker.build_info), looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from .build_info import describe

        print(describe())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hourglass", description="A disk-backed delay-message broker.")
    parser.add_argument("--version", action=_PrintVersion,
                        help="print the version and whether it runs pure Python or mypyc-compiled modules, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a broker node")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    serve.add_argument("--data-dir", default="./hourglass-data", help="data directory (default ./hourglass-data)")
    serve.add_argument("--allow-shared-data-dir", action="store_true",
                       help="start, with a warning, on a --data-dir that group or others have any permission on "
                            "(refused otherwise: chmod -R go-rwx it)")
    serve.add_argument("--backend", default="disk", help="disk (default) or redis://HOST:PORT/DB")
    redis_bulk_batch = ServeConfig().redis_bulk_batch
    serve.add_argument("--redis-bulk-batch", type=int, default=redis_bulk_batch,
                       help=f"on --backend redis://: most messages one Redis script of a deleteMsgs or "
                            f"rescheduleMsgs changes; a call runs as several, whole all the same (default "
                            f"{redis_bulk_batch}: a few ms of Redis each)")
    serve.add_argument("--fsync", default="batch", help="always | batch (default: group commit) | never")
    serve.add_argument("--max-msg-bytes", type=int, default=1024 * 1024,
                       help="largest msg in UTF-8 bytes (default 1 MiB)")
    serve.add_argument("--auth-token-file", default=None,
                       help="file holding a bearer token required by every endpoint but /health; refused if "
                            "group or others may read it (chmod 600)")
    serve.add_argument("--allowed-hosts", default="",
                       help="comma list of Host names served without a token besides loopback names and --host "
                            "(e.g. the name a reverse proxy forwards); with a token every Host is served")
    serve.add_argument("--push-allow", default="",
                       help="comma list of host names, host:port, addresses and CIDRs push subscriptions may POST "
                            "to, checked against the resolved address at connect time (default: none, push off)")
    serve.add_argument("--max-subscriptions", type=int, default=DEFAULT_MAX_SUBSCRIPTIONS,
                       help=f"push subscriptions the node keeps; a subscribe for one more topic is answered 429 "
                            f"(default {DEFAULT_MAX_SUBSCRIPTIONS})")
    serve.add_argument("--max-paused-keys", type=int, default=DEFAULT_MAX_PAUSED_KEYS,
                       help=f"serial keys of one topic paused at once; a pauseTopic of one more is answered 429 "
                            f"(default {DEFAULT_MAX_PAUSED_KEYS})")
    serve.add_argument("--max-paused-keys-total", type=int, default=DEFAULT_MAX_PAUSED_KEYS_TOTAL,
                       help=f"serial keys of the node paused at once, all topics together; a pauseTopic of one "
                            f"more is answered 429 (default {DEFAULT_MAX_PAUSED_KEYS_TOTAL})")
    schedules = ScheduleLimits()
    serve.add_argument("--max-schedules", type=int, default=schedules.max_schedules,
                       help=f"recurring schedules the node keeps; a putSchedule of one more is answered 429 "
                            f"(default {schedules.max_schedules})")
    serve.add_argument("--max-schedule-bytes", type=int, default=schedules.max_bytes,
                       help=f"UTF-8 bytes the schedules' messages hold in all (msg, topic, ids, tag, key, and 200 "
                            f"each); a putSchedule past it is answered "
                            f"429 (default {schedules.max_bytes})")
    jobs = JobLimits()
    serve.add_argument("--max-jobs", type=int, default=jobs.max_jobs,
                       help=f"redriveMsgs jobs running at once (a redriveMsgs while this many run is answered "
                            f"429), and job records kept (a new job drops the oldest ended one's) "
                            f"(default {jobs.max_jobs})")
    serve.add_argument("--job-retention-ms", type=int, default=jobs.retention_ms,
                       help=f"ms an ended redriveMsgs job stays listed by getJob (default {jobs.retention_ms})")
    push = PushLimits()
    serve.add_argument("--push-max-head-bytes", type=int, default=push.max_head_bytes,
                       help=f"bytes of a subscriber's answer head (status line and headers); more: a failed "
                            f"delivery, the connection closed (default {push.max_head_bytes})")
    serve.add_argument("--push-max-headers", type=int, default=push.max_headers,
                       help=f"header lines in a subscriber's answer head; more: a failed delivery (default "
                            f"{push.max_headers})")
    serve.add_argument("--push-head-timeout-ms", type=int, default=push.head_timeout_ms,
                       help=f"ms from a subscriber's first answer byte to its whole head; later: a failed delivery "
                            f"(default {push.head_timeout_ms})")
    serve.add_argument("--push-body-timeout-ms", type=int, default=push.body_timeout_ms,
                       help=f"ms from a subscriber's answer head to its whole body; later: a failed delivery "
                            f"(default {push.body_timeout_ms})")
    serve.add_argument("--push-idle-timeout-ms", type=int, default=push.idle_timeout_ms,
                       help=f"ms a kept-alive push connection with no POST on it is kept (default "
                            f"{push.idle_timeout_ms})")
    serve.add_argument("--push-max-fds", type=int, default=push.max_fds,
                       help=f"file descriptors all push connections hold at once, at most half of what "
                            f"RLIMIT_NOFILE leaves after --reserved-fds and storage's files, shared equally by the "
                            f"subscriptions; "
                            f"client connections never take them; a shard's (default {push.max_fds})")
    serve.add_argument("--allow-readable-token", action="store_true",
                       help="accept an --auth-token-file that group or others may read, with a warning")
    serve.add_argument("--node-id", default=None, help="this node's id in --cluster")
    serve.add_argument("--cluster", default=None,
                       help="id=host:http_port:replication_port,... (every node, this one included); the node "
                            "listens on its own entry's host and ports, --host/--port are then ignored")
    serve.add_argument("--reach-peers", default="",
                       help="cluster only: id=host:http_port:replication_port,... where this node dials those "
                            "peers instead of their --cluster addresses (a proxy in between, as bench/drills.py's "
                            "partitions); default none: every peer at its own address")
    serve.add_argument("--cluster-secret-file", default=None,
                       help="cluster only: a file holding the secret peers prove to each other (Raft port and "
                            "/_cluster/*); at least 16 characters, mode 600. Required unless --insecure-cluster")
    serve.add_argument("--insecure-cluster", action="store_true",
                       help="cluster only: run without a cluster secret (anyone who reaches the Raft port or "
                            "/_cluster/* is a peer: for a throwaway cluster on one machine only); refused if a "
                            "--cluster host is not loopback, unless --insecure-cluster-on-network")
    serve.add_argument("--insecure-cluster-on-network", action="store_true",
                       help="with --insecure-cluster: accept --cluster hosts that are not loopback (anyone who "
                            "reaches their Raft port can run code on the node)")
    serve.add_argument("--acks", default="quorum",
                       help="cluster only: quorum (default: a write is answered once a majority has it on disk) "
                            "or leader (once the leader has; weaker, see README)")
    serve.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024,
                       help="size of a commit-log segment file (default 64 MiB); whole segments are deleted "
                            "once checkpointed")
    serve.add_argument("--index-resident-mb", type=int, default=8,
                       help="the node's budget of resident index pages (MB), shared by each store's id, key and "
                            "end indexes and split between the shards: once a store's indexes together are larger "
                            "than its share, each keeps its pages out of the node's RSS as it works (each probe "
                            "maps one page, a system call: some 4 us an id looked up and inserted; its pages "
                            "dropped every so many calls); smaller ones stay resident (default 8; 0: every index "
                            "from the start). See docs/internals.md, \"Writing\"")
    serve.add_argument("--retain-log-bytes", type=int, default=256 * 1024 * 1024,
                       help="cluster only: the leader keeps this much commit log for followers that fall behind "
                            "(default 256 MiB); one further behind gets a snapshot")
    limits = Limits()
    serve.add_argument("--max-connections", type=int, default=limits.max_connections,
                       help=f"open client connections of the node, all its shards together (default "
                            f"{limits.max_connections}); at the cap a new one replaces a stalled one or is answered "
                            f"503; lowered to keep --reserved-fds free")
    serve.add_argument("--reserved-fds", type=int, default=limits.reserved_fds,
                       help=f"file descriptors below RLIMIT_NOFILE that connections never take, kept for "
                            f"storage; a shard's (default {limits.reserved_fds})")
    serve.add_argument("--head-timeout", type=float, default=limits.head_timeout_s,
                       help=f"seconds a client has to send a request's headers (default {limits.head_timeout_s:g})")
    serve.add_argument("--body-timeout", type=float, default=limits.body_timeout_s,
                       help=f"seconds a client has to send a request's body (default {limits.body_timeout_s:g})")
    serve.add_argument("--min-body-rate", type=int, default=limits.min_body_rate_bps,
                       help=f"bytes a second a request body must average (after 2 s); a slower one is closed, and "
                            f"at the connection cap is the first to make room; 0: no minimum (default "
                            f"{limits.min_body_rate_bps})")
    serve.add_argument("--write-buffer-bytes", type=int, default=limits.write_buffer_bytes,
                       help=f"answers queued on one connection that its client has not read; above it the "
                            f"connection is not read until the client reads (default {limits.write_buffer_bytes})")
    serve.add_argument("--idle-timeout", type=float, default=limits.idle_timeout_s,
                       help=f"seconds an idle keep-alive connection is kept (default {limits.idle_timeout_s:g})")
    serve.add_argument("--body-budget-bytes", type=int, default=limits.body_budget_bytes,
                       help=f"bytes of large bodies (>64 KiB) received or handled at once, all connections "
                            f"of a shard together (a shard's: a node of N shards may hold N times this); over it: "
                            f"429 (default {limits.body_budget_bytes})")
    bodies = BodyLimits()
    serve.add_argument("--max-form-pairs", type=int, default=bodies.max_form_pairs,
                       help=f"parameters in one form body or query string; more: 413 (default "
                            f"{bodies.max_form_pairs})")
    serve.add_argument("--max-batch-msgs", type=int, default=bodies.max_batch_msgs,
                       help=f"messages in one sendMsgBatch; more: 413 (default and most {bodies.max_batch_msgs}); "
                            f"the batch body's byte cap grows with it")
    defaults = Defaults()
    serve.add_argument("--max-ack-timeout-ms", type=int, default=defaults.max_ack_timeout_ms,
                       help=f"largest ackTimeoutMillis a pull gets; larger ones are clamped to it (default "
                            f"{defaults.max_ack_timeout_ms}, 1 h)")
    serve.add_argument("--max-lease-ms", type=int, default=defaults.max_lease_ms,
                       help=f"longest a message stays with one holder by extendMsg, from its hand-over; an "
                            f"extension past it is answered 409 (default {defaults.max_lease_ms}, 12 h; a pull's own "
                            f"ackTimeoutMillis is not bound by it)")
    serve.add_argument("--max-ttl-ms", type=int, default=defaults.max_ttl_ms,
                       help=f"largest ttlMillis a message gets; larger ones are clamped to it (default "
                            f"{defaults.max_ttl_ms}, 30 days)")
    queues = QueueLimits()
    serve.add_argument("--ready-window", type=int, default=queues.window,
                       help=f"ready messages of one topic held in RAM for pulls (a node of shards: over them all); the "
                            f"rest wait on disk and are "
                            f"read back as these are taken (default {queues.window})")
    serve.add_argument("--ready-window-total", type=int, default=queues.window_total,
                       help=f"ready messages held in RAM over all topics (default {queues.window_total})")
    serve.add_argument("--max-inflight", type=int, default=queues.inflight,
                       help=f"messages of one topic being consumed (pulled, not acked; a node of shards: over them all); a "
                            f"pull at the cap takes "
                            f"fewer or none until acks make room (default {queues.inflight})")
    serve.add_argument("--max-inflight-total", type=int, default=queues.inflight_total,
                       help=f"messages being consumed over all topics (default {queues.inflight_total})")
    serve.add_argument("--key-window", type=int, default=queues.key_window,
                       help=f"ready messages of one serial key (sendMsg's key) held in a topic's window; the "
                            f"key's others wait on disk, so one hot key never fills the window (default "
                            f"{queues.key_window})")
    serve.add_argument("--fair-window", type=int, default=0,
                       help="places of a fair topic's pull order one fairKey holds; its others wait on disk "
                            "(default 0: --ready-window / 16)")
    serve.add_argument("--max-topics", type=int, default=queues.topics,
                       help=f"topics the node keeps; a send to a new topic beyond them is answered 429 and stores "
                            f"nothing, until topics retire (default {queues.topics})")
    serve.add_argument("--max-page-bytes", type=int, default=queues.page_bytes,
                       help=f"bytes of messages one listMsg or listDeadMsg page answers at most (at least one "
                            f"message; the cursor goes on) (default {queues.page_bytes}, 4 MiB)")
    # a default read from an instance, as the others are: compiled by mypyc,
    # the class attribute is the field's descriptor, not its default
    metrics_topics = ServeConfig().metrics_topics
    serve.add_argument("--metrics-topics", type=int, default=metrics_topics,
                       help=f"topics with series of their own in /metrics: those with the largest backlogs; every "
                            f"topic counts in the node-level sums (default {metrics_topics}; 0: none)")
    serve.add_argument("--monitor-interval-s", type=int, default=60,
                       help="seconds of each getMonitorData interval: its counts, and camellia's request and "
                            "time-gap metrics, are of the last one (default 60, as camellia)")
    serve.add_argument("--offline-idle-s", type=float, default=20.0,
                       help="after /camellia/health/offline the node answers 200 (drained) once no API call has "
                            "run for this many seconds (default 20, as camellia)")
    console = ConsoleConfig()
    serve.add_argument("--console-session-ttl-s", type=float, default=console.session_ttl_s,
                       help=f"seconds a console login lasts (default {console.session_ttl_s:g}, 12 h); then the "
                            f"console asks for the token again")
    serve.add_argument("--max-console-sessions", type=int, default=console.max_sessions,
                       help=f"console sessions alive at once; a login at the cap ends the oldest (default "
                            f"{console.max_sessions})")
    serve.add_argument("--console-cookie-secure", action="store_true",
                       help="mark the console's session cookie Secure (sent over HTTPS only): for a console "
                            "reached through a TLS-terminating proxy")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    serve.add_argument("--shards", default="auto",
                       help="shard processes of a standalone disk node, each an engine over its part of every "
                            "topic (docs/configuration.md): a count, or auto (default): the cores this process may "
                            "run on, for a new data directory; a directory keeps the count it was made with "
                            "(one made before shards: 1), and another count is refused")
    serve.add_argument("--shard-of", default=None, help=argparse.SUPPRESS)  # I/N: set by the node for its shards
    _transfer_commands(sub)
    return parser


def _transfer_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hourglass export` and `hourglass import` (broker.transfer; docs/operations.md, "Moving messages")."""
    export = sub.add_parser("export", help="write a node's messages as JSON lines, one message a line")
    imports = sub.add_parser("import", help="send messages to a node: from an export's lines, or from "
                                            "camellia-delay-queue's Redis (--from-camellia)")
    for command in (export, imports):
        command.add_argument("--url", required=True, help="the node: http://HOST:PORT (a cluster: its nodes, "
                                                          "separated by commas)")
        command.add_argument("--token-file", default=None, help="a file holding the node's bearer token "
                                                                "(its --auth-token-file)")
        command.add_argument("--allow-readable-token", action="store_true",
                             help="take a --token-file group or others may read, with a warning")
        command.add_argument("--timeout", type=float, default=30.0,
                             help="seconds an attempt of a call may take (default 30)")
        command.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    export.add_argument("--out", default="-", help="the file to write (default -: stdout); written beside "
                                                   "as FILE.part and renamed once whole")
    export.add_argument("--topic", action="append", default=[],
                        help="a topic to export (again for more; default: every topic the node lists)")
    source = imports.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="from_file", default=None, help="an export's file of JSON lines")
    source.add_argument("--from-camellia", default=None,
                        help="camellia-delay-queue's Redis, redis://[:PASSWORD@]HOST:PORT/DB: its pending "
                             "messages, read only")
    imports.add_argument("--namespace", default="", help="with --from-camellia: camellia's namespace")
    imports.add_argument("--state", default=None,
                         help="a file keeping where the import is: run again with it after a kill and it goes "
                              "on from there (default: none, a rerun reads the source again and stores "
                              "nothing twice)")
    imports.add_argument("--rate", type=float, default=None,
                         help="at most this many messages a second (default: as fast as the node answers)")
    imports.add_argument("--batch", type=int, default=500,
                         help="messages of a topic a sendMsgBatch call, 1..1000 (default 500)")
    imports.add_argument("--in-flight", type=int, default=4, help="calls at once, 1..64 (default 4)")
    imports.add_argument("--rejects", default=None,
                         help="a file to add a JSON line to for each message the node refused, with its reason")
    backup = sub.add_parser("backup", help="a backup of a disk node: online (--url), or of a stopped one's "
                                           "--data-dir; into a new directory")
    whose = backup.add_mutually_exclusive_group(required=True)
    whose.add_argument("--url", help="the running node: http://HOST:PORT (a cluster: any one node)")
    whose.add_argument("--data-dir", dest="stopped_dir", help="a stopped node's data directory, copied as it lies "
                       "(refused if a file changes meanwhile: a node runs on it)")
    backup.add_argument("--token-file", default=None, help="a file holding the node's bearer token")
    backup.add_argument("--allow-readable-token", action="store_true",
                        help="take a --token-file group or others may read, with a warning")
    backup.add_argument("--to", required=True, help="the backup's directory (written as DIR.part, renamed once "
                                                    "whole; an existing DIR is replaced then)")
    backup.add_argument("--timeout", type=float, default=30.0, help="seconds to connect (default 30)")
    backup.add_argument("--max-rate-mb", type=float, default=25.0,
                        help="read the backup at most this many MB (10^6 bytes) a second, so a busy node serves "
                             "on at its pace (default 25; 0: as fast as it comes)")
    backup.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    restore = sub.add_parser("restore", help="a new data directory from a backup, checked whole first")
    restore.add_argument("--from", dest="from_dir", required=True, help="the backup's directory")
    restore.add_argument("--data-dir", required=True, help="the data directory to make (empty or absent)")
    restore.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    imports.add_argument("--dry-run", action="store_true",
                         help="read the source and count what would be sent and why the rest would not; "
                              "send nothing")


def run_transfer(args: argparse.Namespace) -> int:
    """`hourglass export`, `import`, `backup` or `restore`: what it did as one JSON line on stdout."""
    import asyncio

    import orjson

    from .transfer import run

    if args.command == "restore":
        from .transfer import backup

        print(orjson.dumps(backup.restore(args.from_dir, args.data_dir)).decode())
        return 0
    token = read_token_file(args.token_file, args.allow_readable_token, "--token-file") if args.token_file else None
    if args.command == "backup":
        from .transfer import backup

        if args.stopped_dir is not None:
            print(orjson.dumps(backup.take_stopped(args.stopped_dir, args.to)).decode())
            return 0
        rate = None if args.max_rate_mb == 0 else args.max_rate_mb * 1e6
        print(orjson.dumps(backup.take(args.url, token, args.to, args.timeout, rate)).decode())
        return 0
    if args.command == "export":
        target = run.Target(args.url, token, timeout_s=args.timeout)
        outcome = asyncio.run(run.export(target, args.out, args.topic))
        print(orjson.dumps(outcome).decode(), file=sys.stderr if args.out == "-" else sys.stdout)
        return 0
    if not 1 <= args.batch <= 1000:
        raise ConfigError(f"--batch must be in 1..1000, got {args.batch}")
    if not 1 <= args.in_flight <= 64:
        raise ConfigError(f"--in-flight must be in 1..64, got {args.in_flight}")
    if args.rate is not None and not args.rate > 0:
        raise ConfigError(f"--rate must be above 0, got {args.rate}")
    if args.namespace and args.from_camellia is None:
        raise ConfigError("--namespace goes with --from-camellia")
    target = run.Target(args.url, token, batch=args.batch, in_flight=args.in_flight, rate=args.rate,
                        timeout_s=args.timeout)
    if args.from_camellia is not None:
        outcome = asyncio.run(run.import_camellia(target, args.from_camellia, args.namespace, state_path=args.state,
                                                  dry_run=args.dry_run, rejects_path=args.rejects))
    else:
        outcome = asyncio.run(run.import_lines(target, args.from_file, state_path=args.state,
                                               dry_run=args.dry_run, rejects_path=args.rejects))
    print(orjson.dumps(outcome).decode())
    return 0


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    cluster = None
    if args.cluster or args.node_id:
        if not (args.cluster and args.node_id):
            raise ConfigError("--cluster and --node-id go together")
        try:
            acks = Acks(args.acks)
        except ValueError:
            raise ConfigError(f"--acks must be quorum or leader, got {args.acks!r}") from None
        secret = None
        if args.cluster_secret_file:
            secret = read_token_file(args.cluster_secret_file, args.allow_readable_token, "--cluster-secret-file")
        peers = reach_peers(parse_cluster(args.cluster), args.reach_peers)
        cluster = ClusterConfig(args.node_id, peers, acks=acks, secret=secret,
                                insecure=args.insecure_cluster, insecure_on_network=args.insecure_cluster_on_network,
                                retain_log_bytes=args.retain_log_bytes)
        args.host, args.port = cluster.me.host, cluster.me.http_port
    elif args.acks != "quorum":
        raise ConfigError("--acks applies to a cluster (--cluster/--node-id)")
    elif args.cluster_secret_file or args.insecure_cluster or args.insecure_cluster_on_network or args.reach_peers:
        raise ConfigError("--cluster-secret-file, --insecure-cluster, --insecure-cluster-on-network and "
                          "--reach-peers apply to a cluster (--cluster/--node-id)")
    token = None
    if args.auth_token_file:
        token = read_token_file(args.auth_token_file, args.allow_readable_token)
    return ServeConfig(host=args.host, port=args.port, data_dir=args.data_dir,
                       allow_shared_data_dir=args.allow_shared_data_dir, backend=args.backend,
                       max_msg_bytes=args.max_msg_bytes, auth_token=token,
                       store=StoreConfig(fsync=fsync_policy(args.fsync), segment_bytes=args.segment_bytes,
                                         index_resident_bytes=args.index_resident_mb << 20),
                       http=Limits(max_connections=args.max_connections, reserved_fds=args.reserved_fds,
                                   head_timeout_s=args.head_timeout,
                                   body_timeout_s=args.body_timeout, idle_timeout_s=args.idle_timeout,
                                   body_budget_bytes=args.body_budget_bytes, min_body_rate_bps=args.min_body_rate,
                                   write_buffer_bytes=args.write_buffer_bytes),
                       allowed_hosts=tuple(h.strip() for h in args.allowed_hosts.split(",") if h.strip()),
                       bodies=BodyLimits(max_form_pairs=args.max_form_pairs, max_batch_msgs=args.max_batch_msgs),
                       defaults=Defaults(max_ack_timeout_ms=args.max_ack_timeout_ms, max_ttl_ms=args.max_ttl_ms,
                                         max_lease_ms=args.max_lease_ms),
                       monitor_interval_s=args.monitor_interval_s, offline_idle_s=args.offline_idle_s,
                       queues=QueueLimits(window=args.ready_window, window_total=args.ready_window_total,
                                          inflight=args.max_inflight, inflight_total=args.max_inflight_total,
                                          key_window=args.key_window, fair_window=args.fair_window,
                                          topics=args.max_topics,
                                          page_bytes=args.max_page_bytes),
                       console=ConsoleConfig(session_ttl_s=args.console_session_ttl_s,
                                             max_sessions=args.max_console_sessions,
                                             cookie_secure=args.console_cookie_secure),
                       metrics_topics=args.metrics_topics, cluster=cluster,
                       redis_bulk_batch=args.redis_bulk_batch,
                       push_allow=tuple(h.strip() for h in args.push_allow.split(",") if h.strip()),
                       max_subscriptions=args.max_subscriptions, max_paused_keys=args.max_paused_keys,
                       max_paused_keys_total=args.max_paused_keys_total,
                       schedules=ScheduleLimits(max_schedules=args.max_schedules,
                                                max_bytes=args.max_schedule_bytes),
                       jobs=JobLimits(max_jobs=args.max_jobs, retention_ms=args.job_retention_ms),
                       push=PushLimits(max_head_bytes=args.push_max_head_bytes, max_headers=args.push_max_headers,
                                       head_timeout_ms=args.push_head_timeout_ms,
                                       body_timeout_ms=args.push_body_timeout_ms,
                                       idle_timeout_ms=args.push_idle_timeout_ms, max_fds=args.push_max_fds),
                       trace_exporters=exporters_from_env(os.environ),
                       shards=args.shards, shard=_shard_of(args.shard_of))


def _shard_of(text: str | None) -> tuple[int, int] | None:
    """--shard-of I/N, which the node gives each of its shard processes."""
    if text is None:
        return None
    index, _, count = text.partition("/")
    return int(index), int(count)


def read_token_file(path: str, allow_readable: bool, flag: str = "--auth-token-file") -> str:
    """The token (or cluster secret) in `path`, surrounding whitespace
    dropped. A file group or others may read or change is refused: whoever
    reads it is any client (or any peer). `allow_readable`
    (--allow-readable-token) takes it with a warning."""
    with open(path, encoding="utf-8") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        token = f.read().strip()
    if mode & 0o077:
        what = f"{path} has mode {mode:04o}: group or others may read or change it"
        if not allow_readable:
            raise ConfigError(f"{flag} {what}; chmod 600 {path}, or pass --allow-readable-token")
        log.warning("%s %s (--allow-readable-token)", flag, what)
    if not token:
        raise ConfigError(f"{flag} {path} is empty")
    return token


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command in ("export", "import", "backup", "restore"):
        try:
            return run_transfer(args)
        except ConfigError as e:
            parser.error(str(e))
        except (HourglassError, OSError) as e:  # the node or the source failed after the retries
            log.error("%s stopped: %s", args.command, e)
            return 1
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    from .node.server import serve

    return serve(config, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
