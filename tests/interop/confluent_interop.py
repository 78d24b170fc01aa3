"""Interoperability check with Confluent's Python client, a Kafka client and
schema-registry serializer we did not write.

Records go through confluent_kafka's AvroSerializer and AvroDeserializer
(fastavro underneath) and its SchemaRegistryClient, with the Confluent
framing (magic byte 0, 4-byte big-endian schema id, Avro binary), the
default subject strategy (<topic>-value) and auto-registration. Reads only
the .avsc files in schemas/. Driven by the Rust tests through
`python3 confluent_interop.py COMMAND ARGS`; results are JSON lines on
stdout, failures a message on stderr and a non-zero exit.

  produce --brokers B --registry URL --topic T --events FILE [--schema PATH] [--subject S]
          [--compression CODEC]
      Registers PATH (default schemas/operation_event.avsc, its text as it is)
      under T-value (or S) and produces FILE's events to T, keys as UTF-8 strings,
      with the project's producer settings (idempotent, the Java client's
      murmur2 partitioner), batches compressed with CODEC (none, gzip,
      snappy, lz4 or zstd; default none). FILE holds one JSON object a line:
        {"key": "cust-1", "event": {...OperationEvent...}}
      with timestamp-millis fields as integer milliseconds, nullable fields
      as the value or null, enums as their symbol, and the `body` union as
        {"type": "reconciler.v1.Started", "value": {"attempt": 1, "worker": "w-1"}}
      (the record's full name; a name without a dot gets the top-level
      record's namespace). A key of null produces a record without a key.
      Prints {"produced": N, "schema_id": ID, "subject": "T-value"}, ID read
      from the framing of the serialized values (null when FILE is empty).
      Exit 3 when the registry refuses the schema (e.g. an incompatible
      change under a compatibility rule), 1 on any other failure.

  consume --brokers B --registry URL --topic T --count N [--timeout S] [--group G]
      Reads T from the beginning (auto.offset.reset=earliest,
      isolation.level=read_committed, group G, default a fresh unique one,
      no commits) until N records arrived or S seconds (default 30) passed;
      values are decoded by AvroDeserializer with the writer schema the
      registry has for each record's id (no reader schema). Prints each
      record as one JSON line: the value's fields in the form `produce`
      reads (timestamp-millis as integer milliseconds, a union of several
      records as {"type": FULL_NAME, "value": {...}}, a union of null and
      one record as the record or null, bytes as hex), plus
        "_key" (UTF-8 string or null; "_key_hex" too when it is not UTF-8),
        "_partition", "_offset", "_schema_id" (from the framing).
      A record without a value prints only these fields, "_schema_id" null.
      Exit 1 with a message on stderr when fewer than N arrive in time, or a
      value is not in the Confluent framing.

  evolved-schema --out PATH
      Writes schemas/operation_event.avsc with a field appended to the
      top-level record: {"name": "trace_id", "type": ["null", "string"],
      "default": null} (a backward- and forward-compatible change).
  incompatible-schema --out PATH
      Writes schemas/operation_event.avsc with the `producer` field's type
      changed from string to long (not backward compatible: a reader with
      it cannot read a string). Events produced with it need an integer
      "producer".
"""
import argparse
import datetime
import json
import os
import struct
import sys
import time
import uuid

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EVENT_SCHEMA = os.path.normpath(os.path.join(REPO, "schemas", "operation_event.avsc"))
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# The project's producer settings (src/kafka/producer.rs PRODUCER_REQUIRED).
PRODUCER_SETTINGS = {"partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"}


def fail(message, code=1):
    print(message, file=sys.stderr)
    sys.exit(code)


def schema_id_of(data):
    """The schema id in a value's Confluent framing, or exits saying why."""
    if data is None or len(data) < 5 or data[0] != 0:
        return None
    return struct.unpack(">I", data[1:5])[0]


# --- produce ---------------------------------------------------------------


def to_fastavro(event, namespace):
    """The event as fastavro writes it: the body union as a (name, record) tuple."""
    event = dict(event)
    body = event.get("body")
    if not (isinstance(body, dict) and set(body) == {"type", "value"} and isinstance(body["type"], str)):
        raise ValueError(f'body must be {{"type": "<record name>", "value": {{...}}}}, got {body!r}')
    name = body["type"] if "." in body["type"] or not namespace else f"{namespace}.{body['type']}"
    event["body"] = (name, body["value"])
    return event


def produce(args):
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import MessageField, SerializationContext, StringSerializer

    with open(args.schema) as f:
        schema_text = f.read()
    namespace = json.loads(schema_text).get("namespace")
    with open(args.events) as f:
        lines = [json.loads(line) for line in f if line.strip()]

    registry = SchemaRegistryClient({"url": args.registry})
    subject = args.subject or f"{args.topic}-value"
    conf = {"auto.register.schemas": True}
    if args.subject:
        # A subject of its own: how a producer that registers a schema
        # elsewhere still writes it to the topic.
        conf["subject.name.strategy"] = lambda ctx, record_name: args.subject
    serializer = AvroSerializer(registry, Schema(schema_text, "AVRO"), conf=conf)
    key_serializer = StringSerializer("utf_8")
    producer = Producer(
        {"bootstrap.servers": args.brokers, "compression.type": args.compression, **PRODUCER_SETTINGS}
    )

    failures = []
    delivered = [0]

    def on_delivery(err, msg):
        if err is not None:
            failures.append(f"partition {msg.partition()}: {err}")
        else:
            delivered[0] += 1

    ids = set()
    for n, line in enumerate(lines, 1):
        try:
            event = to_fastavro(line["event"], namespace)
        except (KeyError, ValueError) as e:
            fail(f"{args.events} line {n}: {e}")
        try:
            value = serializer(event, SerializationContext(args.topic, MessageField.VALUE))
        except SchemaRegistryError as e:
            fail(f"the registry refused the schema {args.schema} for subject {subject}: {e}", 3)
        except (TypeError, ValueError) as e:
            fail(f"{args.events} line {n}: the event does not fit {args.schema}: {e}")
        ids.add(schema_id_of(value))
        key = line.get("key")
        key = key_serializer(key, SerializationContext(args.topic, MessageField.KEY)) if key is not None else None
        while True:
            try:
                producer.produce(args.topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
            except KafkaException as e:
                fail(f"producing to {args.topic}: {e}")
        producer.poll(0)
    left = producer.flush(30)
    if left or failures or delivered[0] != len(lines):
        fail(f"produced {delivered[0]} of {len(lines)} to {args.topic} ({left} undelivered): {'; '.join(failures)}")
    if len(ids) > 1:
        fail(f"the serializer used several schema ids: {sorted(ids)}")
    print(json.dumps({"produced": delivered[0], "schema_id": ids.pop() if ids else None, "subject": subject}))


# --- consume ---------------------------------------------------------------


def tagged_records(schema_text):
    """Full names of the records that are branches of a union of several
    records in the schema (their values keep their name in the output)."""
    from fastavro.schema import parse_schema

    parsed = parse_schema(json.loads(schema_text))
    records, unions = set(), []

    def walk(t):
        if isinstance(t, list):
            unions.append(t)
            for b in t:
                walk(b)
        elif isinstance(t, dict):
            if t.get("type") == "record":
                records.add(t["name"])
                for f in t["fields"]:
                    walk(f["type"])
            elif t.get("type") == "array":
                walk(t["items"])
            elif t.get("type") == "map":
                walk(t["values"])

    walk(parsed)
    tagged = set()
    for union in unions:
        names = [b.get("name") if isinstance(b, dict) else b for b in union]
        names = [n for n in names if n in records]
        if len(names) > 1:
            tagged.update(names)
    return tagged


def to_json(value, tagged):
    """A decoded value as plain JSON: see the module's docstring."""
    if isinstance(value, tuple):  # (record name, record), from return_record_name
        name, record = value
        return {"type": name, "value": to_json(record, tagged)} if name in tagged else to_json(record, tagged)
    if isinstance(value, dict):
        return {k: to_json(v, tagged) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v, tagged) for v in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return (value - EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return value


def consume(args):
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = SchemaRegistryClient({"url": args.registry})
    deserializer = AvroDeserializer(registry, return_record_name=True)
    group = args.group or f"confluent-interop-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": args.brokers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            # A topic that does not exist yet is looked for again soon.
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    tagged_by_id = {}
    got, last_error = 0, None
    deadline = time.monotonic() + args.timeout
    try:
        consumer.subscribe([args.topic])
        while got < args.count:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f" (last client error: {last_error})" if last_error else ""
                fail(f"only {got} of {args.count} records arrived on {args.topic} within {args.timeout} s{why}")
            msg = consumer.poll(min(left, 1.0))
            if msg is None:
                continue
            if msg.error():
                if msg.error().fatal():
                    fail(f"consuming {args.topic}: {msg.error()}")
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    last_error = msg.error()
                continue
            got += 1
            out = {}
            raw = msg.value()
            schema_id = None
            if raw is not None:
                schema_id = schema_id_of(raw)
                if schema_id is None:
                    fail(
                        f"{args.topic} partition {msg.partition()} offset {msg.offset()}: "
                        f"not in the Confluent framing (starts {raw[:8].hex()})"
                    )
                ctx = SerializationContext(msg.topic(), MessageField.VALUE, msg.headers())
                try:
                    value = deserializer(raw, ctx)
                except Exception as e:
                    fail(f"{args.topic} partition {msg.partition()} offset {msg.offset()} (schema id {schema_id}): {e}")
                if schema_id not in tagged_by_id:
                    tagged_by_id[schema_id] = tagged_records(registry.get_schema(schema_id).schema_str)
                out = to_json(value, tagged_by_id[schema_id])
            key = msg.key()
            try:
                out["_key"] = key.decode("utf-8") if key is not None else None
            except UnicodeDecodeError:
                out["_key"], out["_key_hex"] = None, key.hex()
            out["_partition"] = msg.partition()
            out["_offset"] = msg.offset()
            out["_schema_id"] = schema_id
            print(json.dumps(out, default=str), flush=True)
    finally:
        consumer.close()


# --- schemas ---------------------------------------------------------------


def load_event_schema():
    with open(EVENT_SCHEMA) as f:
        return json.load(f)


def write_schema(schema, path):
    with open(path, "w") as f:
        json.dump(schema, f, indent=2)
        f.write("\n")


def evolved_schema(args):
    schema = load_event_schema()
    schema["fields"].append({"name": "trace_id", "type": ["null", "string"], "default": None})
    write_schema(schema, args.out)


def incompatible_schema(args):
    schema = load_event_schema()
    fields = [f for f in schema["fields"] if f["name"] == "producer"]
    if len(fields) != 1 or fields[0]["type"] != "string":
        fail(f"{EVENT_SCHEMA} has no string field `producer`")
    fields[0]["type"] = "long"
    write_schema(schema, args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce")
    p.add_argument("--brokers", required=True)
    p.add_argument("--registry", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--schema", default=EVENT_SCHEMA)
    p.add_argument("--subject")
    p.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.set_defaults(run=produce)

    p = sub.add_parser("consume")
    p.add_argument("--brokers", required=True)
    p.add_argument("--registry", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", required=True, type=int)
    p.add_argument("--timeout", default=30.0, type=float)
    p.add_argument("--group")
    p.set_defaults(run=consume)

    for name, run in (("evolved-schema", evolved_schema), ("incompatible-schema", incompatible_schema)):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.set_defaults(run=run)

    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
