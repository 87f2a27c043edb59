"""Messages moved into and out of a node through its HTTP API
(docs/operations.md, "Moving messages"): `hourglass export`, `hourglass
import` and `hourglass import --from-camellia`.

    sending   the one way in: messages sent to a node in batches a topic,
              at a stated rate, each with its msgId and `strictIdempotence`
              (so a rerun stores nothing twice), a bad message set aside
              with its reason and the rest of its batch sent; progress
              logged, counts answered
    lines     hourglass's JSON lines: `export` pages every topic's messages
              out with listMsg, `import` reads them back in
    camellia  camellia-delay-queue's Redis layout, read (never written):
              its pending messages as sends, a SCAN cursor saved as it goes
              so a rerun resumes

It is a client of the node (broker.client), as any producer is: nothing of
the engine is reached into, so the same commands work on every backend and
across versions.
"""
