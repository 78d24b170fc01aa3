"""Interoperability check with fastavro, an Avro implementation we did not write.

Reads only the .avsc files in schemas/ and the Avro specification's
single-object encoding (C3 01, 8-byte little-endian CRC-64-AVRO fingerprint
of the Parsing Canonical Form, body). Driven by tests/interop.rs.

  encode-event OUT   write an OperationEvent (ManualDecision body) to OUT
  decode-verdict IN  decode the Verdict in IN and print it as JSON
  fingerprints DIR   print "path fingerprint" for every .avsc under DIR
"""
import io
import json
import os
import sys

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "..", "schemas")


def load(name):
    with open(os.path.join(SCHEMAS, name)) as f:
        schema = parse_schema(json.load(f))
    # fastavro gives the fingerprint as the hex of its 8 little-endian bytes.
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    return schema, b"\xc3\x01" + fp


def encode_event(path):
    schema, header = load("operation_event.avsc")
    event = {
        "event_id": "py-1",
        "operation_id": "op-py",
        "entity_id": "cust-7",
        "operation_type": "sync_customer",
        "seq": None,
        "occurred_at": 1_700_000_000_123,
        "producer": "fastavro",
        "body": (
            "reconciler.v1.ManualDecision",
            {
                "actor": "ana",
                "decision": "REQUEUE",
                "note": "checked the CRM",
                "evidence_checked": ["crm record", "worker log"],
            },
        ),
    }
    buf = io.BytesIO()
    buf.write(header)
    schemaless_writer(buf, schema, event)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def decode_verdict(path):
    schema, header = load("verdict.avsc")
    with open(path, "rb") as f:
        data = f.read()
    if data[:10] != header:
        sys.exit(f"header {data[:10].hex()} != expected {header.hex()}")
    record = schemaless_reader(io.BytesIO(data[10:]), schema)
    record["decided_at"] = int(record["decided_at"].timestamp() * 1000)
    # timestamp-millis fields come back as datetimes: as milliseconds again.
    evidence = record["evidence"]
    for key in ("requested_at", "last_event_at", "follow_up_at", "next_attempt_at"):
        if hasattr(evidence.get(key), "timestamp"):
            evidence[key] = int(evidence[key].timestamp() * 1000)
    print(json.dumps(record, default=str))


def fingerprints(root):
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".avsc"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    schema = parse_schema(json.load(f))
                rel = os.path.relpath(path, root)
                print(rel, fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


if __name__ == "__main__":
    commands = {"encode-event": encode_event, "decode-verdict": decode_verdict, "fingerprints": fingerprints}
    commands[sys.argv[1]](sys.argv[2])
