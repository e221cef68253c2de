#!/usr/bin/python3
"""A KV event publisher that puts on the wire what SGLang's ZmqEventPublisher does (its
python/sglang/srt/disaggregation/kv_events.py, 2026), written from that source with pyzmq and
msgpack so that kvgate's subscriber and decoder are checked against Python, not against kvgate's
own encoder. tests/unit/kv/subscriber_test.cc (SglangShapedPublisherFromPython) runs it.

What it reproduces:
- PUB frames [topic, seq as 8 bytes big-endian from 0, msgpack payload]; with a snapshot endpoint
  SGLang's topic is topic + "\\0sgl-kv-epoch=<uuid hex>", and a snapshot barrier's topic adds
  "\\0sgl-kv-snapshot=<id>" (its batch has no events but takes a sequence number).
- payloads as msgspec encodes SGLang's array_like structs: batch [ts, events, attn_dp_rank];
  tagged events ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium] (medium
  written even when None: the struct has no omit_defaults), plus a trailing metadata map
  {"cache_salt": ...} for BlockStoredWithMetadata; ["BlockRemoved", hashes, medium];
  ["AllBlocksCleared"].
- block hashes as SGLang's current builds compute them: SHA-256 over the parent page's digest and
  each token as uint32 little-endian, published as the first 8 digest bytes, big-endian, signed.
- the replay ROUTER: [identity, "", start] answered with [identity, "", seq, payload] for every
  buffered batch from start, then [identity, "", -1 as 8 signed bytes, ""]; served between
  publishes on the publishing thread, as SGLang does.
- a batch whose live send fails is still kept for replay (SGLang appends to its buffer before
  sending): --go-file makes the script skip some live sends on purpose, to force replays.

Differences on purpose: it binds 127.0.0.1 on free ports (printed as "ready pub=... replay=...")
instead of tcp://*:5557, and the content of each batch follows from its sequence number (the test
derives the same content independently): seq % 5 == 0 a salted BlockStored of two pages, 1 an
unsalted one-page BlockStored under a parent, 2 a BlockRemoved, 3 AllBlocksCleared, 4 a snapshot
barrier. Salted chains are hashed unsalted: the subscriber does not hash, the test only checks that
the ids arrive intact.

Protocol with the test: publish every --interval-ms until --go-file exists; then skip the live
sends of the next two batches and of the ninth after, print "skip A B C", publish until 20
batches after the go point, print "last N", and keep serving replays until --max-seconds or a
signal ends it.
"""

import argparse
import hashlib
import os
import struct
import sys
import time
import uuid
from collections import deque

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
EPOCH_MARKER = b"\x00sgl-kv-epoch="
SNAPSHOT_MARKER = b"\x00sgl-kv-snapshot="
PAGE = 4


def page_digest(parent, tokens):
    h = hashlib.sha256()
    if parent is not None:
        h.update(parent)
    for t in tokens:
        h.update(struct.pack("<I", t & 0xFFFFFFFF))
    return h.digest()


def chain_ids(tokens):
    ids, parent = [], None
    for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        parent = page_digest(parent, tokens[i : i + PAGE])
        ids.append(int.from_bytes(parent[:8], "big", signed=True))
    return ids


def events_for(seq):
    kind = seq % 5
    if kind == 0:
        tokens = [seq * 8 + i for i in range(8)]
        return [
            ["BlockStored", chain_ids(tokens), None, tokens, PAGE, None, "GPU",
             {"cache_salt": f"salt-{seq}"}]
        ]
    if kind == 1:
        tokens = [seq * 4 + i for i in range(4)]
        return [["BlockStored", chain_ids(tokens), -(1000 + seq), tokens, PAGE, 7, None]]
    if kind == 2:
        return [["BlockRemoved", [seq, -seq], "CPU_PINNED"]]
    if kind == 3:
        return [["AllBlocksCleared"]]
    return []  # a snapshot barrier


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", default="")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--go-file", required=True)
    ap.add_argument("--interval-ms", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=60)
    args = ap.parse_args()

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.set_hwm(100_000)
    pub.setsockopt(zmq.LINGER, 0)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay = ctx.socket(zmq.ROUTER)
    replay.setsockopt(zmq.LINGER, 0)
    replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
    print(f"ready pub=tcp://127.0.0.1:{pub_port} replay=tcp://127.0.0.1:{replay_port}",
          flush=True)

    topic = args.topic.encode("utf-8")
    epoch = uuid.uuid4().hex
    live_topic = topic + EPOCH_MARKER + epoch.encode("utf-8")
    buffer = deque(maxlen=10_000)

    def serve_replay():
        frames = replay.recv_multipart()
        if len(frames) != 3:
            return
        client_id, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, buf in buffer:
            if seq >= start:
                replay.send_multipart((client_id, b"", seq.to_bytes(8, "big"), buf))
        replay.send_multipart((client_id, b"", END_SEQ, b""))

    seq, skip, last = 0, set(), None
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        if replay.poll(args.interval_ms):
            serve_replay()
            continue
        if last is not None and seq > last:
            continue  # done publishing; keep answering replays
        if last is None and os.path.exists(args.go_file):
            skip = {seq + 1, seq + 2, seq + 9}
            last = seq + 20
            print("skip " + " ".join(str(s) for s in sorted(skip)), flush=True)
        payload = msgpack.packb([time.time(), events_for(seq), args.rank], use_bin_type=True)
        buffer.append((seq, payload))
        frame_topic = live_topic
        if seq % 5 == 4:
            frame_topic += SNAPSHOT_MARKER + uuid.uuid4().hex.encode("utf-8")
        if seq not in skip:
            pub.send_multipart((frame_topic, seq.to_bytes(8, "big"), payload))
        if seq == last:
            print(f"last {seq}", flush=True)
        seq += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
