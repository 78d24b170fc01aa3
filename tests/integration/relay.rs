//! The outbox relay (issue 19) against a throw-away PostgreSQL cluster and
//! the broker: three relays with one killed mid-batch publish every
//! committed row, duplicates only byte-identical and each entity's events
//! in commit order; a rolled-back transaction publishes nothing; writers
//! of one entity are serialised so ids follow commit order; a broker
//! outage makes rows wait (no attempt charged) and the relay catch up; a
//! row the broker refuses becomes a dead letter without holding its
//! entity back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::event::{Body, Event};
use reconciler::outbox::{self, relay::OUTBOX_ID_HEADER};
use reconciler::records::Record;

use crate::common::child::{spawn_relay, write_full_config};
use crate::common::postgres::PgCluster;
use crate::common::run::{bounce_port, broker, stopped, BounceBroker};
use crate::common::{self, wait_for};

fn event(entity: usize, seq: i64) -> Event {
    Event {
        event_id: format!("ev-{entity}-{seq}"),
        operation_id: format!("op-{entity}"),
        entity_id: format!("ent-{entity}"),
        operation_type: "sync_customer".into(),
        seq: Some(seq),
        occurred_at: 1_700_000_000_000 + seq,
        producer: "relay-test".into(),
        body: Body::Started { attempt: seq as i32, worker: "w".into() },
    }
}

/// A cluster with the outbox installed, and a config whose `[relay]`
/// reads its connection string from a variable of its own (set in this
/// process; children get it passed).
struct Outbox {
    pg: PgCluster,
    cfg: Config,
    var: String,
    rt: tokio::runtime::Runtime,
}

impl Outbox {
    fn new(name: &str, brokers: Option<&str>) -> Outbox {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let pg = PgCluster::start();
        pg.execute(outbox::SCHEMA);
        let mut cfg = common::config(name);
        if let Some(b) = brokers {
            cfg.kafka.insert("bootstrap.servers".into(), b.into());
        }
        let var = format!("RELAY_TEST_DB_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        cfg.relay.connection_env = var.clone();
        cfg.relay.batch_size = 100;
        cfg.relay.poll_interval_ms = 200;
        cfg.relay.backoff_initial_ms = 100;
        cfg.relay.backoff_max_ms = 1000;
        cfg.relay.count_interval_ms = 200;
        cfg.relay.bind = "off".into();
        std::env::set_var(&var, pg.connection());
        reconciler::kafka::admin::ensure_topics(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions, 1).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Outbox { pg, cfg, var, rt }
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.pg.connection(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// The single number `sql` selects.
    fn number(&self, sql: &str) -> i64 {
        self.pg.number(sql)
    }

    /// Rows with `status`.
    fn rows(&self, status: &str) -> i64 {
        self.number(&format!("SELECT count(*) FROM reconciler_outbox WHERE status = '{status}'"))
    }

    /// Writes `per_entity` events for each of `entities` entities, each in
    /// a transaction of its own, from `writers` connections at once (each
    /// owns a share of the entities); after some commits a transaction that
    /// enqueues and rolls back. Returns the event ids rolled back.
    fn write(&self, entities: usize, per_entity: i64, writers: usize) -> Vec<String> {
        self.rt.block_on(async {
            let mut tasks = Vec::new();
            for w in 0..writers {
                let (mut client, conn) =
                    tokio_postgres::connect(&self.pg.connection(), tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                tasks.push(tokio::spawn(async move {
                    let codec = Codec::new();
                    let mut rolled_back = Vec::new();
                    for seq in 1..=per_entity {
                        for e in (w..entities).step_by(writers) {
                            let tx = client.transaction().await.unwrap();
                            outbox::enqueue(&tx, &codec, &event(e, seq)).await.unwrap();
                            tx.commit().await.unwrap();
                            if (e as i64 + seq) % 7 == 0 {
                                let tx = client.transaction().await.unwrap();
                                let ev = Event { event_id: format!("rolled-back-{e}-{seq}"), ..event(e, seq + 1000) };
                                outbox::enqueue(&tx, &codec, &ev).await.unwrap();
                                tx.rollback().await.unwrap();
                                rolled_back.push(ev.event_id);
                            }
                        }
                    }
                    rolled_back
                }));
            }
            let mut rolled_back = Vec::new();
            for t in tasks {
                rolled_back.extend(t.await.unwrap());
            }
            rolled_back
        })
    }
}

/// What the topic holds, checked: every record's value decodes, its key is
/// its entity, and a duplicate is byte-identical (value and headers) to the
/// first. Returns, per entity, the seqs in the order first seen, and the
/// number of duplicates.
fn first_seen(records: &[Record]) -> (BTreeMap<String, Vec<i64>>, BTreeMap<String, Event>, usize) {
    let codec = Codec::new();
    let mut order: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut seen: HashMap<String, &Record> = HashMap::new();
    let mut events = BTreeMap::new();
    let mut duplicates = 0;
    for r in records {
        let ev = codec.decode_event(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(r.key.as_deref(), Some(ev.entity_id.as_bytes()), "keyed by entity");
        assert!(r.headers.iter().any(|(k, _)| k == OUTBOX_ID_HEADER), "names its outbox row");
        match seen.get(&ev.event_id) {
            Some(first) => {
                duplicates += 1;
                assert_eq!((&first.value, &first.headers), (&r.value, &r.headers), "a duplicate is byte-identical");
                assert_eq!(first.partition, r.partition);
            }
            None => {
                seen.insert(ev.event_id.clone(), r);
                order.entry(ev.entity_id.clone()).or_default().push(ev.seq.unwrap());
                events.insert(ev.event_id.clone(), ev);
            }
        }
    }
    (order, events, duplicates)
}

#[test]
fn three_relays_one_killed_mid_batch_publish_every_committed_row_once_or_identically_in_entity_order() {
    let _serial = common::serial();
    let o = Outbox::new("relay-kill", None);
    let dir = common::temp_dir("relay-kill");
    let config = write_full_config(&o.cfg, &dir);
    let conn = o.pg.connection();
    let log = |i: usize| dir.join(format!("relay-{i}.log"));
    // The first relay stops itself (SIGSTOP) on its first batch the broker
    // acknowledged, before marking it published; it is then killed -9.
    let doomed = spawn_relay(&config, (&o.var, &conn), Some("relay::published=return(stop)"), &log(0));
    let relays =
        [spawn_relay(&config, (&o.var, &conn), None, &log(1)), spawn_relay(&config, (&o.var, &conn), None, &log(2))];

    let (entities, per_entity) = (300, 10);
    let rolled_back = o.write(entities, per_entity, 6);
    let committed = entities as i64 * per_entity;
    assert!(
        wait_for(Duration::from_secs(60), || stopped(doomed.pid())),
        "the first relay never held an acknowledged batch; log:\n{}",
        doomed.log_tail()
    );
    doomed.kill9();
    assert!(
        wait_for(Duration::from_secs(120), || o.rows("pending") == 0),
        "{} rows still pending; logs:\n{}\n{}",
        o.rows("pending"),
        relays[0].log_tail(),
        relays[1].log_tail()
    );
    assert_eq!((o.rows("published"), o.rows("dead_letter")), (committed, 0));

    let records =
        reconciler::kafka::reader::read_to_end(&o.cfg.kafka, &o.cfg.topics.events, Duration::from_secs(60)).unwrap();
    let (order, events, duplicates) = first_seen(&records);
    assert_eq!(events.len() as i64, committed, "every committed row is on the topic");
    for id in &rolled_back {
        assert!(!events.contains_key(id), "rolled-back {id} was published");
    }
    assert!(!rolled_back.is_empty());
    let expected: Vec<i64> = (1..=per_entity).collect();
    for (entity, seqs) in &order {
        assert_eq!(seqs, &expected, "{entity}: first publications out of commit order");
    }
    // The killed relay's batch was acknowledged but not marked: it went
    // out again, so the kill was mid-batch.
    assert!(duplicates > 0, "no row was published twice: the kill was not mid-batch");
    // The reconciler's layer-1 dedup (by event_id) absorbs every duplicate.
    let (codec, policy) = (Codec::new(), reconciler::core::Policy::default());
    let mut engine = reconciler::core::memory::MemoryEngine::new();
    let mut absorbed = 0;
    for r in &records {
        let ev = codec.decode_event(r.value.as_deref().unwrap()).unwrap();
        let pos = reconciler::core::event::SourcePos { partition: r.partition, offset: r.offset };
        let d = engine.process(&policy, ev, pos, &mut Vec::new());
        absorbed += usize::from(d == reconciler::core::Disposition::Duplicate);
    }
    assert_eq!(absorbed, duplicates, "every duplicate, and only those, is a duplicate delivery to the core");
    eprintln!(
        "relay kill -9 suite: {committed} rows committed, {} rolled back, {} records on the topic ({duplicates} duplicates)",
        rolled_back.len(),
        records.len()
    );
    for r in relays {
        r.stop();
    }
}

#[test]
fn writers_of_one_entity_wait_for_each_other_so_ids_follow_commit_order() {
    let _serial = common::serial();
    let o = Outbox::new("relay-order", None);
    // The schema applies again over itself (what `relay --install` does on
    // every start).
    o.pg.execute(outbox::SCHEMA);
    let codec = Codec::new();
    o.rt.block_on(async {
        let mut first = o.client().await;
        let mut second = o.client().await;
        let watcher = o.client().await;
        // The second writer enqueues first and holds its transaction open.
        let t2 = second.transaction().await.unwrap();
        let id2 = outbox::enqueue(&t2, &codec, &event(1, 1)).await.unwrap();
        // The first writer's enqueue of the same entity waits for it...
        let pending = tokio::spawn(async move {
            let t1 = first.transaction().await.unwrap();
            let id1 = outbox::enqueue(&t1, &Codec::new(), &event(1, 2)).await.unwrap();
            t1.commit().await.unwrap();
            id1
        });
        let waiting =
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'";
        let mut blocked = false;
        for _ in 0..200 {
            if watcher.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) == 1 {
                blocked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await; // polling interval
        }
        assert!(blocked, "the second writer of the entity did not wait for the first");
        // ... and another entity's does not.
        let mut third = o.client().await;
        let t3 = third.transaction().await.unwrap();
        outbox::enqueue(&t3, &codec, &event(2, 1)).await.unwrap();
        t3.commit().await.unwrap();
        t2.commit().await.unwrap();
        let id1 = pending.await.unwrap();
        assert!(id1 > id2, "the later commit has the larger id ({id1} vs {id2})");
    });
    // A rolled-back transaction leaves no row.
    o.rt.block_on(async {
        let mut c = o.client().await;
        let tx = c.transaction().await.unwrap();
        outbox::enqueue(&tx, &codec, &event(3, 1)).await.unwrap();
        tx.rollback().await.unwrap();
    });
    assert_eq!(o.number("SELECT count(*) FROM reconciler_outbox WHERE entity_id = 'ent-3'"), 0);
}

#[test]
fn rows_wait_out_a_broker_outage_and_a_refused_row_becomes_a_dead_letter_without_holding_its_entity() {
    let _serial = common::serial();
    let port = bounce_port() + 4;
    broker("start", port);
    let _broker = BounceBroker(port);
    let mut o = Outbox::new("relay-outage", Some(&format!("127.0.0.1:{port}")));
    o.cfg.relay.delivery_timeout_ms = 2000;
    o.cfg.relay.max_attempts = 2;
    o.cfg.consumer.max_record_bytes = 10_000;
    let registry = prometheus::Registry::new();
    let mut relay = reconciler::outbox::relay::Relay::new(&o.cfg, &registry).unwrap();
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    let running = std::thread::spawn(move || relay.run(&flag));
    let metric = |name: &str| -> f64 {
        reconciler::metrics::render(&registry)
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };

    // A row too large for the broker, then a normal one of the same entity.
    let codec = Codec::new();
    o.rt.block_on(async {
        let c = o.client().await;
        let big = Event { body: Body::Started { attempt: 1, worker: "x".repeat(20_000) }, ..event(1000, 1) };
        outbox::enqueue(&c, &codec, &big).await.unwrap();
        outbox::enqueue(&c, &codec, &event(1000, 2)).await.unwrap();
    });
    assert!(wait_for(Duration::from_secs(30), || o.rows("published") == 1), "the entity's next row was held back");
    assert_eq!(o.rows("dead_letter"), 1);
    let error = o.rt.block_on(async {
        o.client()
            .await
            .query_one("SELECT last_error, attempts FROM reconciler_outbox WHERE status = 'dead_letter'", &[])
            .await
            .unwrap()
    });
    let (last_error, attempts): (String, i32) = (error.get(0), error.get(1));
    assert!(last_error.contains("MessageSizeTooLarge"), "{last_error}");
    assert_eq!(attempts, 2);

    // The broker goes away; rows written meanwhile wait, charged nothing.
    broker("kill", port);
    let rolled_back = o.write(50, 4, 2);
    assert!(
        wait_for(Duration::from_secs(60), || metric("reconciler_relay_publish_failures_total{class=\"outage\"}") > 0.0),
        "the relay never noticed the outage"
    );
    assert_eq!(o.number("SELECT count(*) FROM reconciler_outbox WHERE status = 'pending' AND attempts = 0"), 200);
    broker("restart", port);
    assert!(wait_for(Duration::from_secs(120), || o.rows("pending") == 0), "{} rows still pending", o.rows("pending"));
    assert_eq!((o.rows("published"), o.rows("dead_letter")), (201, 1));
    let records =
        reconciler::kafka::reader::read_to_end(&o.cfg.kafka, &o.cfg.topics.events, Duration::from_secs(60)).unwrap();
    let (order, events, _) = first_seen(&records);
    assert_eq!(events.len(), 201);
    assert!(rolled_back.iter().all(|id| !events.contains_key(id)));
    assert_eq!(order["ent-1000"], vec![2], "the dead letter's successor");
    for e in 0..50 {
        assert_eq!(order[&format!("ent-{e}")], vec![1, 2, 3, 4], "ent-{e} out of commit order");
    }

    // A re-drive killed inside its transaction leaves nothing behind: the
    // row is still a dead letter, unaudited, and the next re-drive is the
    // first.
    let dir = common::temp_dir("relay-redrive");
    let config = write_full_config(&o.cfg, &dir);
    let killed = std::process::Command::new(env!("CARGO_BIN_EXE_reconciler"))
        .arg("--config")
        .arg(&config)
        .args(["outbox", "redrive", "--class", "MessageSizeTooLarge", "--actor", "ana"])
        .env(&o.var, o.pg.connection())
        .env("FAILPOINTS", "outbox::redriven=return")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&killed.stderr);
    assert!(!killed.status.success() && err.contains("crash point outbox::redriven reached"), "{err}");
    assert_eq!(o.rows("dead_letter"), 1);
    assert_eq!(o.number("SELECT count(*) FROM reconciler_outbox_redrive"), 0);

    // A re-drive makes the dead letter pending again, audited; refused
    // again (still too large), it is a new dead letter with fresh attempts.
    let (dead_id, report) = o.rt.block_on(async {
        let mut c = o.client().await;
        let dead: i64 =
            c.query_one("SELECT id FROM reconciler_outbox WHERE status = 'dead_letter'", &[]).await.unwrap().get(0);
        use reconciler::outbox::dead_letter::{redrive, OutboxSelection};
        let wrong = OutboxSelection { ids: vec![dead], class: Some("InvalidRecord".into()) };
        let e = redrive(&mut c, &wrong, "ana", "", false).await.unwrap_err().to_string();
        assert!(e.contains("not dead letters of the outbox of that class"), "ids and class together mean both: {e}");
        let by_class = OutboxSelection { ids: vec![], class: Some("MessageSizeTooLarge".into()) };
        let dry = redrive(&mut c, &by_class, "", "", true).await.unwrap();
        assert_eq!((dry.dry_run, dry.ids.clone()), (true, vec![dead]), "a dry run needs no actor and changes nothing");
        (dead, redrive(&mut c, &by_class, "ana", "limit raised", false).await.unwrap())
    });
    assert_eq!(report.ids, vec![dead_id]);
    assert_eq!(
        o.number("SELECT count(*) FROM reconciler_outbox_redrive WHERE actor = 'ana' AND note = 'limit raised'"),
        1
    );
    assert!(
        wait_for(Duration::from_secs(30), || o.number(&format!(
            "SELECT count(*) FROM reconciler_outbox WHERE id = {dead_id} AND status = 'dead_letter' AND attempts = 2"
        )) == 1
            && o.number("SELECT count(*) FROM reconciler_outbox_redrive") == 1),
        "the re-driven row was not tried again"
    );
    shutdown.store(true, Ordering::Relaxed);
    running.join().unwrap().unwrap();
}

#[test]
fn a_relay_refuses_an_id_sequence_with_a_cache() {
    let _serial = common::serial();
    let o = Outbox::new("relay-cache", None);
    o.pg.execute("ALTER SEQUENCE reconciler_outbox_id_seq CACHE 20");
    let registry = prometheus::Registry::new();
    let mut relay = reconciler::outbox::relay::Relay::new(&o.cfg, &registry).unwrap();
    let e = relay.run(&AtomicBool::new(false)).unwrap_err().to_string();
    assert!(e.contains("CACHE 20") && e.contains("commit order"), "{e}");
}

/// The relay gives up like the pipeline: with its topic gone (and topic
/// auto-creation off), the broker refuses every row for a reason that is
/// not the row's. Readiness turns red at the first refusal, the relay
/// exits non-zero once that has lasted `give_up_after_ms`, and every row
/// is still pending (none charged, none lost) for a relay started after
/// the fix.
#[test]
fn a_relay_whose_topic_is_gone_turns_unready_and_exits_non_zero_after_the_bound_with_every_row_pending() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;

    let _serial = common::serial();
    let mut o = Outbox::new("relay-refused", None);
    o.cfg.kafka.insert("allow.auto.create.topics".into(), "false".into());
    o.cfg.relay.give_up_after_ms = 4_000;
    o.cfg.relay.delivery_timeout_ms = 2_000;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", crate::common::postgres::free_port()).parse().unwrap();
    o.cfg.relay.bind = addr.to_string();
    let dir = common::temp_dir("relay-refused");
    let config = write_full_config(&o.cfg, &dir);
    let conn = o.pg.connection();
    let mut relay = spawn_relay(&config, (&o.var, &conn), None, &dir.join("relay.log"));
    let readyz = || crate::common::http::try_request(addr, "GET", "/readyz", &[], "").ok();
    assert!(
        wait_for(Duration::from_secs(30), || readyz().is_some_and(|(code, _)| code == 200)),
        "the relay never answered ready; log:\n{}",
        relay.log_tail()
    );

    // The topic goes away under the running relay.
    let admin: AdminClient<DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", common::brokers()).create().unwrap();
    o.rt.block_on(admin.delete_topics(&[o.cfg.topics.events.as_str()], &AdminOptions::new())).unwrap();
    let marks = reconciler::kafka::watermarks::Watermarks::new(&o.cfg.kafka).unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || marks.exists(&o.cfg.topics.events).is_ok_and(|e| !e)),
        "the topic was not deleted"
    );
    o.write(5, 2, 1);
    let written = std::time::Instant::now();

    let mut refused = None;
    let status = loop {
        if let Some(status) = relay.exited() {
            break status;
        }
        assert!(written.elapsed() < Duration::from_secs(120), "the relay kept retrying; log:\n{}", relay.log_tail());
        if let Some((503, body)) = readyz() {
            refused = Some(body);
        }
        std::thread::sleep(Duration::from_millis(100)); // polling interval
    };
    let refused = refused.unwrap_or_else(|| panic!("readiness never turned red; log:\n{}", relay.log_tail()));
    assert!(refused.contains("publish_refused") && refused.to_lowercase().contains("topic"), "{refused}");
    assert!(!status.success(), "the relay gave up with a zero exit: {status:?}");
    assert!(written.elapsed() >= Duration::from_secs(4), "it stopped before give_up_after_ms");
    assert!(relay.log_tail().contains("PublishRefused"), "{}", relay.log_tail());
    assert_eq!(o.number("SELECT count(*) FROM reconciler_outbox WHERE status = 'pending' AND attempts = 0"), 10);
    assert_eq!(o.number("SELECT count(*) FROM reconciler_outbox"), 10, "rows lost or added");
}
