"""Idle memory: ``hermes worker`` beside its broker's client library doing the same wait.

Both run from an environment holding hermes-core and the driver's
distribution alone (``bench/envs.py``), as a user installs them. The worker is
started on an empty queue that an earlier worker (not measured) set up,
as a redeployed worker finds it; the client library's row is the library's own
consumer, connected and waiting for a message on the same broker
(:data:`RAW_CONSUMERS`). Each is measured (``VmRSS``) once it has waited a
moment: the difference is what a worker adds over the client it cannot do
without. The filesystem driver has no client library: its row is the bare
interpreter polling a directory, for reference.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bench import envs
from bench.run import (
    ROOT,
    Env,
    HermesSetting,
    Run,
    rss_mb,
    wait_until_logged,
    worker,
)
from hermes.core.driver import DriverUrl

IDLE = "idle worker RSS"
CLIENT = "client library alone"

#: Broker -> the client library's own consumer waiting for a message (``URL``,
#: ``NAME`` and, for SQS and Kafka, ``ENDPOINT`` / ``BOOTSTRAP`` are set before it).
#: Kafka's consumes the worker's topic (``TOPIC``) with the librdkafka settings of
#: the worker's URL (``SETTINGS``), and waits as the worker does: in its group,
#: the topic's partitions assigned. (With librdkafka's default session timeout
#: the local broker holds a join for minutes: the consumer would be measured
#: before it held any partition, while the worker holds them all.)
RAW_CONSUMERS = {
    "redis": """
import redis
client = redis.Redis.from_url(URL)
client.ping()
print("ready", flush=True)
while True:
    client.blpop(NAME, 1)
""",
    "rabbitmq": """
import pika
connection = pika.BlockingConnection(pika.URLParameters(URL))
channel = connection.channel()
channel.queue_declare(NAME, auto_delete=True)
channel.basic_qos(prefetch_count=1)
channel.basic_consume(NAME, lambda *args: None)
print("ready", flush=True)
while True:
    connection.process_data_events(1)
""",
    "sqs": """
import boto3
client = boto3.client("sqs", region_name="us-east-1", endpoint_url=ENDPOINT)
queue = client.create_queue(QueueName=NAME)["QueueUrl"]
print("ready", flush=True)
while True:
    client.receive_message(QueueUrl=queue, WaitTimeSeconds=1, MaxNumberOfMessages=10)
""",
    "kafka": """
import time
from confluent_kafka import Consumer
consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": NAME,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False, **SETTINGS})
assigned = []
consumer.subscribe([TOPIC], on_assign=lambda consumer, partitions: assigned.extend(partitions))
deadline = time.monotonic() + 60
while not assigned:
    if time.monotonic() > deadline:
        raise SystemExit(f"no partition of {TOPIC} assigned in 60 s")
    consumer.poll(1)
print("ready", flush=True)
while True:
    consumer.poll(1)
""",
    "postgres": """
import psycopg
connection = psycopg.connect(URL, autocommit=True)
connection.execute("LISTEN bench_idle")
print("ready", flush=True)
while True:
    for _ in connection.notifies(timeout=1):
        pass
""",
    "filesystem": """
import os, time
os.makedirs(NAME, exist_ok=True)
print("ready", flush=True)
while True:
    os.listdir(NAME)
    time.sleep(0.02)
""",
}


#: How a broker's client-library row waits, where it is not "connected and waiting".
_RAW_NOTES = {
    "kafka": "its own consumer on the worker's topic, waiting with its partitions assigned",
    "filesystem": "no client library: the interpreter polling a directory",
}


def _raw_program(broker: str, url: str, name: str) -> str:
    parsed = DriverUrl.parse(url)
    constants: dict[str, object] = {"URL": url.split("?", 1)[0], "NAME": name}
    if broker == "sqs":
        constants["ENDPOINT"] = parsed.options["endpoint_url"]
    elif broker == "kafka":
        constants["BOOTSTRAP"] = url.split("//", 1)[1].split("/", 1)[0]
        constants["TOPIC"] = parsed.path
        constants["SETTINGS"] = {k: v for k, v in parsed.options.items() if "." in k}
    elif broker == "filesystem":
        constants["NAME"] = str(Path(tempfile.gettempdir()) / name)
    head = "".join(f"{key} = {value!r}\n" for key, value in constants.items())
    return head + RAW_CONSUMERS[broker]


def measure(run: Run, env: Env, broker: str, setting: HermesSetting, base_url: str) -> None:
    """The idle rows of ``broker``: ``hermes worker`` and its client library, in turn."""
    python = envs.python(f"hermes-{broker}")
    settle_s = 0.5 if run.quick else 1.5
    url = setting.url(base_url)
    # The first worker, not measured, sets the broker's queues up (Kafka creates
    # its topics); each measured one finds them there, as a redeployed worker does.
    for round_ in range(-1, run.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "worker.log"
            argv = [python, "-m", "bench.hermes_cli", "worker", "--url", url]
            argv += ["--handlers", "bench.jobs:register"]
            process_env = envs.environ(env.make(1, Path(tmp) / "unused", "noop"))
            with worker(argv, process_env, log) as proc:
                wait_until_logged(log, "Reading priorit", proc, 120)
                time.sleep(settle_s)
                rss = rss_mb(proc.pid)
        if round_ < 0:
            continue
        note = (
            f"hermes-core and hermes-{broker} alone installed; waiting on an empty queue "
            "that an earlier worker set up"
        )
        run.add(broker, setting.system(), IDLE, rss, "MB", note)
        run.add(broker, CLIENT, "RSS", _raw_rss(python, broker, url, settle_s), "MB",
                _RAW_NOTES.get(broker, "its own consumer, connected and waiting"))  # fmt: skip


def _raw_rss(python: str, broker: str, url: str, settle_s: float) -> float:
    name = f"bench-idle-{uuid.uuid4().hex[:8]}"
    program = _raw_program(broker, url, name)
    proc = subprocess.Popen(
        [python, "-c", program],
        cwd=ROOT,
        env=envs.environ(dict(os.environ)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{broker} raw consumer did not start: {proc.stderr.read()[-500:]}")
        time.sleep(settle_s)
        return rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
