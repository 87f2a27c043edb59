"""The URL paths of camellia-delay-queue's HTTP API, in one place for the
server (broker.http.api) and the clients (broker.client, broker.spark): every
endpoint is PREFIX + its name, e.g. PREFIX + "sendMsgBatch". Also the
prefixes of the node's other paths, by which the command table
(broker.http.commands) knows who may call them."""

PREFIX = "/camellia/delayQueue/"
# camellia's health switch (broker.http.health): open, as /health
HEALTH_PREFIX = "/camellia/health/"
# the calls between the nodes of a cluster (broker.cluster.peers)
CLUSTER_PREFIX = "/_cluster/"
# an online backup of the store of the node (or shard) it reaches, answered
# there on any node of a cluster, not forwarded (broker.disk.backups)
BACKUP_PATH = PREFIX + "backupShard"
