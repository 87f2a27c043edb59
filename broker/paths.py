"""The URL paths of camellia-delay-queue's HTTP API, in one place for the
server (broker.api) and the clients (broker.client, broker.spark): every
endpoint is PREFIX + its name, e.g. PREFIX + "sendMsgBatch"."""

PREFIX = "/camellia/delayQueue/"
